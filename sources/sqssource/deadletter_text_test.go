package sqssource_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/idemq/idemq/consumer"
)

// A reason holding characters SQS refuses in a message attribute (a control
// character quoted by PostgreSQL's error, invalid UTF-8, U+FFFE) still lands
// in the dead-letter queue, its text escaped: before, SendMessage failed and
// the original came back every RedriveDelay until retention deleted it.
func TestDeadLetterReasonWithControlCharacters(t *testing.T) {
	needServices(t)
	q := newQueue(t, queueOptions{})
	publish(t, q.URL, false, outMsg{Key: "ctl-1", Body: `{"amount":"1\u0001"}`})
	src := newSource(t, sourceConfig(t, q))
	ctx := testContext(t, 30*time.Second)
	msgs, err := src.Receive(ctx, 1)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Receive = %d messages, %v", len(msgs), err)
	}
	cause := errors.New("ERROR: invalid input syntax for type integer: \"1\x01\" (SQLSTATE 22P02); bad \xff, \ufffe, \x1b[0m")
	reason := &consumer.DeadLetterError{Key: "ctl-1", Attempts: 1, Err: cause}
	if err := src.DeadLetter(ctx, msgs[0], reason); err != nil {
		t.Fatalf("DeadLetter with a control character in the reason: %v", err)
	}
	got := drain(t, q.DLQURL, 1, 20*time.Second)
	if len(got) != 1 {
		t.Fatalf("dead-letter queue holds %d messages, want 1", len(got))
	}
	r := aws.ToString(got[0].MessageAttributes[consumer.MetaReason].StringValue)
	if want := `integer: "1\x01"`; !strings.Contains(r, want) || !strings.Contains(r, `bad \xff, \ufffe, \x1b[0m`) {
		t.Errorf("reason attribute %q, want the refused characters escaped (%s)", r, want)
	}
	if n := queueDepth(t, q.URL); n != 0 {
		t.Errorf("%d messages left in the queue, want 0", n)
	}
}
