package kafkasource

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
)

// requestCommit queues to the reader's commit loop the settled prefix of
// every partition that advanced since the last request and whose newest
// passed message belongs to the current group generation; kafka-go merges
// the requests and commits as Ack says. It returns an error only when the
// request could not be queued (ctx done or the reader closed); the
// partitions then stay dirty and the next request carries them.
func (s *Source) requestCommit(ctx context.Context) error {
	gen := s.observeGeneration(ctx)

	s.mu.Lock()
	commit, stale := s.ledger.committable(gen)
	s.mu.Unlock()
	for _, p := range stale {
		s.stats.staleCommitsSkipped.Add(1)
		s.log.InfoContext(ctx, "commit skipped: the settled messages were fetched before the latest rebalance; the partition's owner recommits",
			consumer.LogKeyQueue, p.topic, logKeyPartition, p.partition, logKeyOffset, p.last+1,
			logKeyGeneration, gen)
	}
	if len(commit) == 0 {
		return nil
	}

	// kafka-go commits the offset after each message's.
	offsets := make([]kafka.Message, len(commit))
	for i, p := range commit {
		offsets[i] = kafka.Message{Topic: p.topic, Partition: p.partition, Offset: p.last}
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CommitTimeout)
	defer cancel()
	if err := s.reader.CommitMessages(cctx, offsets...); err != nil {
		s.mu.Lock()
		s.ledger.uncommit(commit)
		s.mu.Unlock()
		return fmt.Errorf("kafkasource: queue offset commit of %d partition(s): %w", len(offsets), err)
	}
	return nil
}

// committedPrefix is the start of the line kafka-go's Generation.CommitOffsets
// logs after every successful offset commit.
const committedPrefix = "committed offsets for group"

// joinedPrefix is the start of the line kafka-go's ConsumerGroup logs after
// it joined a new generation, before the reader starts that generation's
// partition readers at the committed offsets.
const joinedPrefix = "Joined group "

// commitLoopFunc is the kafka-go function that runs the periodic commits
// and reports their failures to the error logger.
const commitLoopFunc = "kafka-go.(*Reader).commitLoopInterval"

// readerLogger returns kafka-go's Logger for the reader: it counts the
// successful offset commits and the generations joined, which kafka-go
// reports only there, queues the members it gives up for the source to
// leave the group with (see leavingFormat), and passes every line to l at
// Debug when l logs at that level.
func readerLogger(l *slog.Logger, c *counters) kafka.Logger {
	debug := kafkaLogger(l, slog.LevelDebug)
	return kafka.LoggerFunc(func(format string, args ...any) {
		switch {
		case strings.HasPrefix(format, committedPrefix):
			c.commits.Add(1)
		case strings.HasPrefix(format, joinedPrefix):
			c.joins.Add(1)
		case format == leavingFormat && len(args) == 2:
			if member, ok := args[1].(string); ok && member != "" {
				select { // never blocks kafka-go's group goroutine
				case c.abandoned <- member:
				default: // left to its session timeout
				}
			}
		}
		if debug != nil {
			debug.Printf(format, args...)
		}
	})
}

// readerErrorLogger returns kafka-go's ErrorLogger for the reader: it counts
// the failed offset commits of kafka-go's commit loop (identified by the
// reporting function, since the group's join errors are reported with the
// same format) and passes the lines to l at Warn, a few a minute each for the
// commit loop and for the rest (see lineLimit): while the broker is away,
// kafka-go reports every attempt to reach it, every JoinGroupBackoff.
func readerErrorLogger(l *slog.Logger, c *counters) kafka.Logger {
	var commits, others lineLimit
	return kafka.LoggerFunc(func(format string, args ...any) {
		if fromCommitLoop() {
			c.commitFailures.Add(1)
			if n, ok := commits.pass(time.Now()); ok {
				l.LogAttrs(context.Background(), slog.LevelWarn, "offset commit failed; kafka-go retries it at the next CommitInterval tick",
					slog.String(consumer.LogKeyError, strings.TrimSpace(fmt.Sprintf(format, args...))),
					slog.String(logKeyComponent, "kafka-go"), slog.Int(consumer.LogKeySuppressed, n))
			}
			return
		}
		if !l.Enabled(context.Background(), slog.LevelWarn) {
			return
		}
		if n, ok := others.pass(time.Now()); ok {
			l.Log(context.Background(), slog.LevelWarn, strings.TrimSpace(fmt.Sprintf(format, args...)), logKeyComponent, "kafka-go",
				consumer.LogKeySuppressed, n)
		}
	})
}

// lineLimit lets linesPerMinute lines through per minute and counts the
// others. It is safe for concurrent use.
type lineLimit struct {
	mu         sync.Mutex
	start      time.Time // of the current minute
	passed     int       // lines passed in it
	suppressed int       // lines held back since the last one passed
}

// linesPerMinute is how many lines of one kind lineLimit passes per minute.
const linesPerMinute = 5

// pass reports whether a line at now may be logged and, if so, how many were
// held back before it.
func (ll *lineLimit) pass(now time.Time) (suppressed int, ok bool) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	if now.Sub(ll.start) >= time.Minute {
		ll.start, ll.passed = now, 0
	}
	if ll.passed >= linesPerMinute {
		ll.suppressed++
		return 0, false
	}
	ll.passed++
	suppressed, ll.suppressed = ll.suppressed, 0
	return suppressed, true
}

// fromCommitLoop reports whether the caller's goroutine runs kafka-go's
// commit loop. Errors are rare, so walking the stack is cheap enough.
func fromCommitLoop() bool {
	pcs := make([]uintptr, 16)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, commitLoopFunc) {
			return true
		}
		if !more {
			return false
		}
	}
}
