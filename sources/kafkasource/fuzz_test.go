package kafkasource

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/metatext"
)

// fuzzHeaders builds Kafka headers from newline-separated name=value pairs.
func fuzzHeaders(spec string) []kafka.Header {
	if spec == "" {
		return nil
	}
	var hs []kafka.Header
	for _, line := range strings.Split(spec, "\n") {
		k, v, _ := strings.Cut(line, "=")
		hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
	}
	return hs
}

// FuzzKeyFunc checks that keyOf returns the value of the last key header, and
// exactly what Config.KeyFunc returns when one is set, or its panic as a
// *consumer.PanicError.
func FuzzKeyFunc(f *testing.F) {
	f.Add("idempotency-key=k1", "", false)
	f.Add("idempotency-key=k1\nidempotency-key=k2", "", false)
	f.Add("other=x\nidempotency-key=", "", false)
	f.Add("Idempotency-Key=upper", "", false)
	f.Add("h=1", "custom", false)
	f.Add("idempotency-key=\xff\x00", "x-key", true)
	f.Fuzz(func(t *testing.T, spec, keyHeader string, useKeyFunc bool) {
		cfg := Config{KeyHeader: keyHeader}
		if cfg.KeyHeader == "" {
			cfg.KeyHeader = DefaultKeyHeader
		}
		if useKeyFunc {
			// A KeyFunc that panics on some bodies, as one indexing a
			// malformed body would.
			cfg.KeyFunc = func(km kafka.Message) string { return "fn:" + string(km.Value[len(km.Value)%7]) }
		}
		s := &Source{cfg: cfg}
		km := kafka.Message{Topic: "t", Value: []byte(spec), Headers: fuzzHeaders(spec)}
		got, err := s.keyOf(km)
		if useKeyFunc {
			if len(spec) < 7 { // the index len%7 is out of range
				var pe *consumer.PanicError
				if !errors.As(err, &pe) || got != "" {
					t.Fatalf("keyOf with a panicking KeyFunc = %q, %v; want a *consumer.PanicError", got, err)
				}
				return
			}
			if want := "fn:" + string(spec[len(spec)%7]); err != nil || got != want {
				t.Fatalf("keyOf = %q, %v; KeyFunc returned %q", got, err, want)
			}
			return
		}
		if err != nil {
			t.Fatalf("keyOf without a KeyFunc failed: %v", err)
		}
		want := ""
		for _, h := range km.Headers {
			if h.Key == cfg.KeyHeader {
				want = string(h.Value)
			}
		}
		if got != want {
			t.Fatalf("keyOf = %q, want the last %q header %q", got, cfg.KeyHeader, want)
		}
	})
}

// reservedHeaders are the headers deadLetterCopy writes itself.
var reservedHeaders = []string{consumer.MetaReason, consumer.MetaAttempts, MetaOriginTopic, MetaOriginPartition,
	MetaOriginOffset, MetaGroup, consumer.MetaKey, consumer.MetaDeadLetteredAt}

// FuzzDeadLetterCopy checks the dead-letter copy of a message with hostile
// headers: a producer cannot forge the copy's reserved headers, each is
// written once, the other headers, the key and the value are kept in order,
// the reason is bounded and cut on a UTF-8 boundary, and every value written
// is UTF-8 within the XML range (what SQS accepts: the same text on every
// broker).
func FuzzDeadLetterCopy(f *testing.F) {
	f.Add("a=1\nb=2", "handler failed", "order-1", 3, int64(42), 1, "")
	f.Add(consumer.MetaReason+"=forged\n"+consumer.MetaAttempts+"=0\n"+consumer.MetaKey+"=forged", "boom", "k", 1, int64(0), 0, "dlq")
	f.Add("", strings.Repeat("é", maxReasonBytes/2+1), "", 0, int64(-1), -1, "")
	f.Add("x=\xff", "\xff\xfe", "\x00", -5, int64(1<<62), 1<<30, "")
	f.Add("", "invalid input syntax for type integer: \"1\x01\"", "k\x01", 1, int64(7), 0, "")
	f.Fuzz(func(t *testing.T, spec, reason, key string, attempts int, offset int64, part int, dlTopic string) {
		s := &Source{cfg: Config{GroupID: "g", DeadLetterTopic: dlTopic}}
		km := kafka.Message{Topic: "orders", Partition: part, Offset: offset, Key: []byte("pk"), Value: []byte(spec), Headers: fuzzHeaders(spec)}
		msg := &consumer.Message{Key: "msg-key", Attempt: 7}
		var reasonErr error
		if reason != "" {
			reasonErr = &consumer.DeadLetterError{Key: key, Attempts: attempts, Err: errors.New(reason)}
		}
		c := s.deadLetterCopy(km, msg, reasonErr)

		if c.Topic != s.cfg.deadLetterTopic("orders") || string(c.Key) != "pk" || string(c.Value) != spec {
			t.Fatalf("copy %q key %q value %q", c.Topic, c.Key, c.Value)
		}
		// The original's own headers first, in order, without reserved ones.
		var kept []kafka.Header
		for _, h := range km.Headers {
			if !isDeadLetterHeader(h.Key) {
				kept = append(kept, h)
			}
		}
		if len(c.Headers) < len(kept) {
			t.Fatalf("%d headers, want at least %d", len(c.Headers), len(kept))
		}
		for i, h := range kept {
			if c.Headers[i].Key != h.Key || string(c.Headers[i].Value) != string(h.Value) {
				t.Fatalf("header %d = %q, want %q", i, c.Headers[i].Key, h.Key)
			}
		}
		got := map[string][]string{}
		for _, h := range c.Headers[len(kept):] {
			got[h.Key] = append(got[h.Key], string(h.Value))
		}
		wantKey, wantAttempts := msg.Key, msg.Attempt
		if reasonErr != nil {
			wantAttempts = attempts
			if key != "" {
				wantKey = key
			}
		}
		for _, name := range reservedHeaders {
			vs := got[name]
			if name == consumer.MetaKey && wantKey == "" {
				if len(vs) != 0 {
					t.Fatalf("key header %q without a key", vs)
				}
				continue
			}
			if len(vs) != 1 {
				t.Fatalf("header %q written %d times: %q", name, len(vs), vs)
			}
		}
		if len(c.Headers) != len(kept)+len(got) {
			t.Fatalf("unexpected headers after the original's: %v", got)
		}
		text := got[consumer.MetaReason][0]
		if len(text) > maxReasonBytes {
			t.Fatalf("reason of %d bytes, limit %d", len(text), maxReasonBytes)
		}
		if reasonErr != nil {
			full := metatext.Clean(reasonErr.Error(), 0)
			if !strings.HasPrefix(full, strings.TrimSuffix(text, metatext.Truncated)) {
				t.Fatalf("reason %q is not a prefix of %q", text, full)
			}
		}
		// Every value written is the same text the other brokers carry:
		// UTF-8 within the XML range that SQS accepts.
		for name, vs := range got {
			for _, v := range vs {
				if !metatext.ValidString(v) {
					t.Fatalf("header %s = %q holds a character outside the XML range", name, v)
				}
			}
		}
		if got[consumer.MetaAttempts][0] != strconv.Itoa(wantAttempts) {
			t.Fatalf("attempts header %q, want %d", got[consumer.MetaAttempts][0], wantAttempts)
		}
		if wantKey != "" && got[consumer.MetaKey][0] != metatext.Clean(wantKey, consumer.MaxKeyBytes) {
			t.Fatalf("key header %q, want %q", got[consumer.MetaKey][0], wantKey)
		}
		if o, err := strconv.ParseInt(got[MetaOriginOffset][0], 10, 64); err != nil || o != offset {
			t.Fatalf("origin offset %q, want %d", got[MetaOriginOffset][0], offset)
		}
		if p, err := strconv.Atoi(got[MetaOriginPartition][0]); err != nil || p != part {
			t.Fatalf("origin partition %q, want %d", got[MetaOriginPartition][0], part)
		}
		if got[MetaOriginTopic][0] != "orders" || got[MetaGroup][0] != "g" {
			t.Fatalf("origin topic %q, group %q", got[MetaOriginTopic][0], got[MetaGroup][0])
		}
	})
}
