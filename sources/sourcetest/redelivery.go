package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
)

// testCloseRedelivers receives messages without acknowledging them, closes
// the source, and checks that a new source receives them again with the same
// ID, Key and body, and an Attempt that did not go down.
func (s *suite) testCloseRedelivers(t *testing.T) {
	topic := s.h.NewTopic(t)
	out := outgoing("close", 5)
	want := byKey(out)
	s.h.Publish(t, topic, out...)

	first := make(map[string]*consumer.Message, len(out))
	src := s.open(t, topic)
	receiveKeys(t, src, s.deliveryTimeout(), keysOf(out), func(m *consumer.Message) {
		if _, ok := first[m.Key]; !ok {
			first[m.Key] = m
		}
	})
	if err := src.Close(); err != nil {
		t.Fatalf("sourcetest: Close with unacknowledged messages: %v", err)
	}

	again := s.open(t, topic)
	receiveKeys(t, again, s.redeliveryTimeout()+s.deliveryTimeout(), keysOf(out), func(m *consumer.Message) {
		checkMessage(t, m, want[m.Key])
		checkRedelivery(t, first[m.Key], m, false)
		ack(t, again, m)
	})
}

// testPartialAck acknowledges every other message, closes the source, and
// checks that a new source receives every message that was not acknowledged:
// a source must never acknowledge a message that was not passed to Ack (a
// cumulative offset commit past an unacknowledged message loses it).
func (s *suite) testPartialAck(t *testing.T) {
	topic, out, src, got := s.publishReceive(t, "partial", 10)
	acked := make(map[string]bool)
	var acks, keep []*consumer.Message
	for _, m := range firstByKey(got) {
		if n := indexOf(out, m.Key); n%2 == 1 {
			acked[m.Key] = true
			acks = append(acks, m)
		} else {
			keep = append(keep, m)
		}
	}
	ack(t, src, acks...)
	if err := src.Close(); err != nil {
		t.Fatalf("sourcetest: Close: %v", err)
	}

	var unacked []string
	for _, m := range keep {
		unacked = append(unacked, m.Key)
	}
	again := s.open(t, topic)
	back := 0
	receiveKeys(t, again, s.redeliveryTimeout()+s.deliveryTimeout(), unacked, func(m *consumer.Message) {
		if acked[m.Key] {
			back++
		}
		ack(t, again, m)
	})
	if back > 0 {
		t.Logf("sourcetest: %d acknowledged message(s) were delivered again (allowed: at-least-once)", back)
	}
}

// publishReceive publishes n messages (outgoing(prefix, n)) to a new topic
// and receives each at least once from a new source, acknowledging none.
func (s *suite) publishReceive(t *testing.T, prefix string, n int) (string, []Outgoing, consumer.Source, []*consumer.Message) {
	topic := s.h.NewTopic(t)
	out := outgoing(prefix, n)
	s.h.Publish(t, topic, out...)
	src := s.open(t, topic)
	return topic, out, src, receiveKeys(t, src, s.deliveryTimeout(), keysOf(out), nil)
}

// indexOf returns the position of key in msgs, or -1.
func indexOf(msgs []Outgoing, key string) int {
	for i, m := range msgs {
		if m.Key == key {
			return i
		}
	}
	return -1
}

// testRetry hands messages back with Retry and checks that they come back
// with the same ID and Key and a higher Attempt, and not before the delay
// when the source honours it.
func (s *suite) testRetry(t *testing.T) {
	_, out, src, got := s.publishReceive(t, "retry", 2)
	firsts := firstByKey(got)
	now, later := firsts[out[0].Key], firsts[out[1].Key]
	ackExcept(t, src, got, now, later)

	ctx, cancel := context.WithTimeout(context.Background(), s.deliveryTimeout())
	defer cancel()
	const delay = 2 * time.Second
	if err := src.Retry(ctx, now, 0); err != nil {
		t.Fatalf("sourcetest: Retry(%q, 0): %v", now.Key, err)
	}
	if err := src.Retry(ctx, later, delay); err != nil {
		t.Fatalf("sourcetest: Retry(%q, %s): %v", later.Key, delay, err)
	}
	retried := time.Now()

	var early []string
	receiveKeys(t, src, delay+s.deliveryTimeout(), []string{now.Key, later.Key}, func(m *consumer.Message) {
		switch m.Key {
		case now.Key:
			checkRedelivery(t, now, m, true)
		case later.Key:
			if since := time.Since(retried); since < delay/2 {
				early = append(early, fmt.Sprintf("attempt %d after %s", m.Attempt, since.Round(time.Millisecond)))
			}
			checkRedelivery(t, later, m, true)
		}
		ack(t, src, m)
	})
	if s.h.Features.RetryDelayHonoured && len(early) > 0 {
		t.Errorf("sourcetest: message %q retried with a delay of %s came back before half of it: %v", later.Key, delay, early)
	}
}

// testDeadLetter dead-letters a message and checks that it is not delivered
// again and, when the dead-letter destination is readable, that it arrived
// there with its reason.
func (s *suite) testDeadLetter(t *testing.T) {
	topic, out, src, got := s.publishReceive(t, "dead", 2)
	poison := firstByKey(got)[out[0].Key]
	ackExcept(t, src, got, poison)

	ctx, cancel := context.WithTimeout(context.Background(), s.deliveryTimeout())
	defer cancel()
	reason := &consumer.DeadLetterError{Key: poison.Key, Attempts: poison.Attempt, Err: consumer.Permanent(errors.New(poisonReason))}
	if err := src.DeadLetter(ctx, poison, reason); err != nil {
		t.Fatalf("sourcetest: DeadLetter(%q): %v", poison.Key, err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("sourcetest: Close: %v", err)
	}
	expectQuiet(t, s.open(t, topic), s.redeliveryTimeout(), "the only unacknowledged message was dead-lettered, so a new source must receive nothing")

	if !s.h.Features.DeadLetterReadable {
		return
	}
	var letters []Outgoing
	deadline := time.Now().Add(s.deliveryTimeout())
	for {
		letters = s.h.DeadLetters(t, topic)
		if len(letters) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(letters) != 1 {
		t.Fatalf("sourcetest: %d dead letters on %s after %s, want exactly 1 (%q)", len(letters), topic, s.deliveryTimeout(), poison.Key)
	}
	d := letters[0]
	if d.Key != poison.Key || string(d.Body) != string(out[0].Body) {
		t.Errorf("sourcetest: dead letter has key %q body %q, want key %q body %q", d.Key, d.Body, poison.Key, out[0].Body)
	}
	if r := d.Headers[consumer.MetaReason]; !strings.Contains(r, poisonReason) {
		t.Errorf("sourcetest: dead letter reason (Headers[%q]) is %q, want it to contain %q", consumer.MetaReason, r, poisonReason)
	}
}

const poisonReason = "sourcetest: poison message"

// checkRedelivery compares a redelivery with the earlier delivery of the same
// message. mustGrow requires a higher Attempt (after Retry); otherwise Attempt
// must not go down.
func checkRedelivery(t *testing.T, before, after *consumer.Message, mustGrow bool) {
	t.Helper()
	if before == nil {
		t.Errorf("sourcetest: redelivered key %q was never delivered before", after.Key)
		return
	}
	if after.ID != before.ID {
		t.Errorf("sourcetest: key %q came back with ID %q, first delivered with ID %q (IDs must be stable)", after.Key, after.ID, before.ID)
	}
	if after.Key != before.Key {
		t.Errorf("sourcetest: message %q came back with Key %q, first delivered with %q", after.ID, after.Key, before.Key)
	}
	switch {
	case mustGrow && after.Attempt <= before.Attempt:
		t.Errorf("sourcetest: key %q came back after Retry with Attempt %d, first delivered with Attempt %d (must grow)", after.Key, after.Attempt, before.Attempt)
	case after.Attempt < before.Attempt:
		t.Errorf("sourcetest: key %q came back with Attempt %d, lower than its earlier %d", after.Key, after.Attempt, before.Attempt)
	}
	if !after.Redelivered {
		t.Logf("sourcetest: key %q came back with Redelivered=false (allowed where the broker cannot know)", after.Key)
	}
}

// firstByKey returns the first message received for each key.
func firstByKey(msgs []*consumer.Message) map[string]*consumer.Message {
	m := make(map[string]*consumer.Message, len(msgs))
	for _, msg := range msgs {
		if _, ok := m[msg.Key]; !ok {
			m[msg.Key] = msg
		}
	}
	return m
}

// ackExcept acknowledges every message in got except those with the keys of
// keep.
func ackExcept(t *testing.T, src consumer.Source, got []*consumer.Message, keep ...*consumer.Message) {
	t.Helper()
	skip := make(map[string]bool, len(keep))
	for _, k := range keep {
		skip[k.Key] = true
	}
	var acks []*consumer.Message
	for _, m := range got {
		if !skip[m.Key] {
			acks = append(acks, m)
		}
	}
	ack(t, src, acks...)
}
