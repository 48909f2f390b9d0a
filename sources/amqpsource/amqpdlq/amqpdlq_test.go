package amqpdlq_test

import (
	"context"
	"encoding/binary"
	"net"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/amqpsource/amqpdlq"
	"github.com/idemq/idemq/sources/internal/dlqtest"
)

// TestHelperReplayChild is TestRabbitMQ's replay child (see
// dlqtest.ReplayChild): its connection is killed as it acknowledges a dead
// letter.
func TestHelperReplayChild(t *testing.T) {
	dlqtest.ReplayChild(t, func(t *testing.T, env func(string) string) dlq.Broker {
		acks := &atomic.Int64{}
		dial := func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 10*time.Second)
			if err != nil {
				return nil, err
			}
			return &killingConn{Conn: c, acks: acks}, nil
		}
		return openAMQPDLQ(t, env("IDEMQ_DLQ_AMQP_URL"), env("IDEMQ_DLQ_QUEUE"), dial)
	})
}

// New refuses a configuration without its required fields with one
// *idemq.ConfigError per field.
func TestNewRefusesMissingFields(t *testing.T) {
	_, err := amqpdlq.New(amqpdlq.Config{})
	dlqtest.CheckMissingFields(t, err, "amqpdlq.Config.URL", "amqpdlq.Config.Queue")
}

// killingConn SIGKILLs the process as it is about to acknowledge (remove)
// a dead letter past the ones the child may remove (dlqtest.KillAtRemoval):
// its copy is confirmed in the origin queue, the dead letter not
// acknowledged. It reads the AMQP frames each
// Write carries (amqp091 flushes whole frames): a method frame (type 1)
// whose class and method are basic (60) ack (80).
type killingConn struct {
	net.Conn
	acks *atomic.Int64
}

func (k *killingConn) Write(p []byte) (int, error) {
	for f := p; len(f) >= 11; {
		size := int(binary.BigEndian.Uint32(f[3:7]))
		if len(f) < 8+size {
			break
		}
		if f[0] == 1 && binary.BigEndian.Uint16(f[7:9]) == 60 && binary.BigEndian.Uint16(f[9:11]) == 80 {
			dlqtest.KillAtRemoval(k.acks)
		}
		f = f[8+size:]
	}
	return k.Conn.Write(p)
}

func openAMQPDLQ(t *testing.T, url, queue string, dial func(network, addr string) (net.Conn, error)) *amqpdlq.Broker {
	t.Helper()
	b, err := amqpdlq.New(amqpdlq.Config{URL: url, Queue: queue, AMQP: amqp.Config{Dial: dial}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withChannel runs fn on a confirming channel of a connection of its own.
func withChannel(t *testing.T, url string, fn func(ctx context.Context, ch *amqp.Channel)) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fn(ctx, ch)
}

func publishConfirmed(ctx context.Context, t *testing.T, ch *amqp.Channel, queue string, p amqp.Publishing) {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish to %s not confirmed (acked %v): %v", queue, ok, err)
	}
}

func TestRabbitMQ(t *testing.T) {
	url := testenv.AMQPURL(t)
	queue := runtest.UniqueName(t, "idemq-dlq")
	cfg := amqpsource.Config{URL: url, Queue: queue, Declare: &amqpsource.Topology{}}
	dead := amqpsource.DeadLetterQueue(cfg)
	brokerenv.DeleteQueuesAtCleanup(t, url, queue, dead)
	// The first source declares the queues; messages are published after.
	first := openAMQPSource(t, cfg)
	dlqtest.RunScenario(t, dlqtest.Rig{
		Publish: func(t *testing.T, key, body string) {
			withChannel(t, url, func(ctx context.Context, ch *amqp.Channel) {
				publishConfirmed(ctx, t, ch, queue, amqp.Publishing{
					Headers:      amqp.Table{amqpsource.DefaultKeyHeader: key, "tenant": "acme"},
					DeliveryMode: amqp.Persistent, MessageId: "id-" + key, Body: []byte(body),
				})
			})
		},
		Source: func(t *testing.T) consumer.Source {
			if first != nil {
				src := first
				first = nil
				return src
			}
			return openAMQPSource(t, cfg)
		},
		Broker: func(t *testing.T) dlq.Broker { return openAMQPDLQ(t, url, dead, nil) },
		// A second copy of each dead letter: replayed as well, absorbed.
		Again: func(t *testing.T, _ dlq.Broker) {
			withChannel(t, url, func(ctx context.Context, ch *amqp.Channel) {
				var ds []amqp.Delivery
				for {
					d, ok, err := ch.Get(dead, false)
					if err != nil {
						t.Fatal(err)
					}
					if !ok {
						break
					}
					ds = append(ds, d)
				}
				for _, d := range ds {
					publishConfirmed(ctx, t, ch, dead, amqp.Publishing{Headers: d.Headers, DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Body: d.Body})
				}
				if err := ch.Nack(ds[len(ds)-1].DeliveryTag, true, true); err != nil {
					t.Fatal(err)
				}
			})
		},
		AgainBefore:  true,
		ChildEnv:     []string{"IDEMQ_DLQ_AMQP_URL=" + url, "IDEMQ_DLQ_QUEUE=" + dead},
		KillInWindow: true,
	})
}

func openAMQPSource(t *testing.T, cfg amqpsource.Config) consumer.Source {
	t.Helper()
	cfg.Logger = runtest.Logger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := amqpsource.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// A dead letter that another user published with its user-id property is
// replayed without it: the broker refuses a user-id other than the
// publishing connection's user (406 PRECONDITION_FAILED), so a copy keeping
// it would never reach the origin queue.
func TestReplayDropsAnotherUsersUserID(t *testing.T) {
	url := testenv.AMQPURL(t)
	queue := runtest.UniqueName(t, "idemq-dlq-userid")
	cfg := amqpsource.Config{URL: url, Queue: queue, Declare: &amqpsource.Topology{}}
	dead := amqpsource.DeadLetterQueue(cfg)
	brokerenv.DeleteQueuesAtCleanup(t, url, queue, dead)
	if err := openAMQPSource(t, cfg).Close(); err != nil { // declares the queues
		t.Fatal(err)
	}

	// User other publishes the message with its own user-id; the broker
	// dead-letters it when the consumer rejects it, properties kept.
	other, otherURL := otherUser(t, url)
	withChannel(t, otherURL, func(ctx context.Context, ch *amqp.Channel) {
		publishConfirmed(ctx, t, ch, queue, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: "id-1", UserId: other, Body: []byte("b"),
		})
	})
	withChannel(t, url, func(ctx context.Context, ch *amqp.Channel) {
		d, ok, err := ch.Get(queue, false)
		if err != nil || !ok {
			t.Fatalf("get from %s: ok %v, %v", queue, ok, err)
		}
		if err := d.Reject(false); err != nil {
			t.Fatal(err)
		}
	})

	b := openAMQPDLQ(t, url, dead, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int
	var err error
	for n == 0 && err == nil && ctx.Err() == nil { // the dead letter arrives
		n, err = b.Scan(ctx, func(*dlq.Letter) dlq.Action { return dlq.ActionReplay })
	}
	if err != nil || n != 1 {
		t.Fatalf("Scan = %d, %v; want the dead letter replayed", n, err)
	}
	withChannel(t, url, func(ctx context.Context, ch *amqp.Channel) {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("get the replayed copy from %s: ok %v, %v", queue, ok, err)
		}
		if d.MessageId != "id-1" || d.UserId != "" {
			t.Errorf("replayed copy has MessageId %q, UserId %q; want id-1 and no user-id", d.MessageId, d.UserId)
		}
	})
}

// otherUser adds a user with every permission on url's virtual host, with
// rabbitmqctl on the broker's host, and deletes it when t ends. It returns
// the user's name and url with its credentials.
func otherUser(t *testing.T, url string) (name, userURL string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl not found: cannot add a second user to the broker")
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	uri.Username, uri.Password = runtest.UniqueName(t, "idemq-other"), "idemq-other-secret"
	ctl := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
		}
	}
	ctl("add_user", uri.Username, uri.Password)
	t.Cleanup(func() { ctl("delete_user", uri.Username) })
	ctl("set_permissions", "-p", uri.Vhost, uri.Username, ".*", ".*", ".*")
	return uri.Username, uri.String()
}
