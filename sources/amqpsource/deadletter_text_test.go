package amqpsource_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// A dead letter's reason and key carry the same text on every broker: the
// characters SQS refuses (a control character quoted by PostgreSQL's error,
// invalid UTF-8, U+FFFE) are escaped as sqssource and kafkasource escape
// them, although RabbitMQ would take the raw bytes.
func TestDeadLetterReasonWithControlCharacters(t *testing.T) {
	url := brokerURL(t)
	q := newQueue(t, url, quorum, 0)
	publish(t, url, q, sourcetest.Outgoing{Key: "ctl-1", Body: []byte(`{"amount":"1\u0001"}`)})
	src := newSource(t, amqpsource.Config{URL: url, Queue: q})
	msgs := receive(t, src, 1, 20*time.Second)
	cause := errors.New("ERROR: invalid input syntax for type integer: \"1\x01\" (SQLSTATE 22P02); bad \xff, \ufffe")
	reason := &consumer.DeadLetterError{Key: "ctl\x01key", Attempts: 1, Err: cause}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := src.DeadLetter(ctx, msgs[0], reason); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	var dead []string
	runtest.WaitFor(t, 20*time.Second, runtest.Say("a dead letter"), func() bool {
		dead = dead[:0]
		for _, d := range peek(t, url, q+".dlq") {
			r, _ := d.Headers[consumer.MetaReason].(string)
			k, _ := d.Headers[consumer.MetaKey].(string)
			dead = append(dead, r, k)
		}
		return len(dead) > 0
	})
	if len(dead) != 2 || !strings.Contains(dead[0], `integer: "1\x01"`) || !strings.Contains(dead[0], `bad \xff, \ufffe`) || dead[1] != `ctl\x01key` {
		t.Fatalf("dead letter reason and key %q, want the refused characters escaped", dead)
	}
}
