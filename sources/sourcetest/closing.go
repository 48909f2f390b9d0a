package sourcetest

import (
	"context"
	"errors"
	"testing"
	"time"
)

// testCancelAndClose checks that Receive honours its context, that Close is
// idempotent and interrupts a blocked Receive, and that every method fails
// with consumer.ErrClosed after Close.
func (s *suite) testCancelAndClose(t *testing.T) {
	topic := s.h.NewTopic(t)

	for _, c := range []struct {
		name, what string
		ctx        func() (context.Context, context.CancelFunc)
		want       error
	}{
		{"CancelledContext", "Receive with a cancelled context", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
		{"CancelWhileBlocked", "Receive on an empty topic after its context was cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"Deadline", "Receive on an empty topic past its deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := s.open(t, topic)
			ctx, cancel := c.ctx()
			defer cancel()
			err := returnsPromptly(t, c.what, func() error {
				_, err := src.Receive(ctx, receiveBatch)
				return err
			})
			if !errors.Is(err, c.want) {
				t.Fatalf("sourcetest: %s returned %v, want an error matching %v", c.what, err, c.want)
			}
		})
	}

	t.Run("CloseWhileBlocked", func(t *testing.T) {
		src := s.open(t, topic)
		ctx, cancel := context.WithTimeout(context.Background(), 2*promptly)
		defer cancel()
		time.AfterFunc(200*time.Millisecond, func() { _ = src.Close() })
		err := returnsPromptly(t, "Receive blocked on an empty topic when its source was closed", func() error {
			_, err := src.Receive(ctx, receiveBatch)
			return err
		})
		if !isClosed(err) {
			t.Fatalf("sourcetest: Receive interrupted by Close returned %v, want an error matching consumer.ErrClosed", err)
		}
	})

	t.Run("MethodsAfterClose", func(t *testing.T) {
		local := s.h.NewTopic(t)
		s.h.Publish(t, local, outgoing("closed", 3)...)
		src := s.open(t, local)
		msgs := receiveKeys(t, src, s.deliveryTimeout(), keysOf(outgoing("closed", 3)), nil)

		if err := src.Close(); err != nil {
			t.Fatalf("sourcetest: first Close: %v", err)
		}
		err := returnsPromptly(t, "second Close", src.Close)
		if err != nil && !isClosed(err) {
			t.Errorf("sourcetest: second Close returned %v, want nil or an error matching consumer.ErrClosed", err)
		}

		ctx, cancel := context.WithTimeout(context.Background(), promptly)
		defer cancel()
		checks := []struct {
			name string
			call func() error
		}{
			{"Receive", func() error { _, err := src.Receive(ctx, receiveBatch); return err }},
			{"Ack", func() error { return src.Ack(ctx, msgs[:1]) }},
			{"Retry", func() error { return src.Retry(ctx, msgs[1], 0) }},
			{"DeadLetter", func() error { return src.DeadLetter(ctx, msgs[2], errors.New("sourcetest: after close")) }},
		}
		for _, c := range checks {
			err := returnsPromptly(t, c.name+" after Close", c.call)
			if !isClosed(err) {
				t.Errorf("sourcetest: %s after Close returned %v, want an error matching consumer.ErrClosed", c.name, err)
			}
		}
	})
}
