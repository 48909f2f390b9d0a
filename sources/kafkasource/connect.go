package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrUnreachable is matched by the error of New and Ping when none of
// Config.Brokers answered; the error also carries each broker's dial or
// request error.
var ErrUnreachable = errors.New("kafkasource: no broker reachable")

// Ping checks that at least one of Config.Brokers accepts a connection and
// answers a metadata request before ctx is done. New does the same check,
// bounded by Config.ConnectTimeout; Ping serves health checks later on. A
// nil error says nothing about the consumer group or the topics.
func (s *Source) Ping(ctx context.Context) error { return ping(ctx, s.cfg) }

// ping dials the brokers of cfg in turn until one answers a metadata request.
func ping(ctx context.Context, cfg Config) error {
	errs := make([]error, 0, len(cfg.Brokers))
	for _, addr := range cfg.Brokers {
		err := pingOne(ctx, cfg.Dialer, addr)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%w (%d broker(s) tried): %w", ErrUnreachable, len(errs), errors.Join(errs...))
}

func pingOne(ctx context.Context, d *kafka.Dialer, addr string) error {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	} else {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if _, err := conn.Brokers(); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	return nil
}
