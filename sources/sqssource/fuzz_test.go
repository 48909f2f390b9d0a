package sqssource

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/metatext"
)

// fuzzAttributes builds message attributes from ';'-separated names and
// values; bit i of binary makes attribute i a Binary one.
func fuzzAttributes(names, values string, binary uint16) map[string]types.MessageAttributeValue {
	ns := strings.Split(names, ";")
	vs := strings.Split(values, ";")
	attrs := make(map[string]types.MessageAttributeValue, len(ns))
	for i, n := range ns {
		v := ""
		if i < len(vs) {
			v = vs[i]
		}
		if i < 16 && binary&(1<<i) != 0 {
			attrs[n] = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte(v)}
			continue
		}
		attrs[n] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	return attrs
}

func fuzzSource(fifo bool) *Source {
	return &Source{
		cfg: Config{
			QueueURL:              "http://127.0.0.1:9324/000000000000/orders",
			KeyAttribute:          "idempotency-key",
			PartitionKeyAttribute: "pk",
		},
		log:       slog.New(slog.DiscardHandler),
		queueName: "orders",
		fifo:      fifo,
	}
}

// FuzzMessage checks the conversion of a received SQS message: the attempt is
// at least 1 and is the receive count when that is a positive integer, only
// String and Number attributes become headers, and the key and partition key
// come from the documented places.
func FuzzMessage(f *testing.F) {
	f.Add("idempotency-key;pk;other", "k1;p1;o", uint16(0), "3", "dedup-1", "group", "body", false)
	f.Add("idempotency-key", "k1", uint16(1), "0", "", "", "", true)
	f.Add("", "", uint16(0), "-5", "d", "g", "", true)
	f.Add("pk", "", uint16(0), "99999999999999999999", "", "", "x", false)
	f.Add("a;a;a", "1;2;3", uint16(0xffff), " 2", "", "", "", false)
	f.Fuzz(func(t *testing.T, names, values string, binary uint16, receiveCount, dedupID, group, body string, fifo bool) {
		s := fuzzSource(fifo)
		raw := types.Message{
			MessageId:         aws.String("m-1"),
			Body:              aws.String(body),
			MessageAttributes: fuzzAttributes(names, values, binary),
			Attributes: map[string]string{
				string(types.MessageSystemAttributeNameApproximateReceiveCount): receiveCount,
				string(types.MessageSystemAttributeNameMessageDeduplicationId):  dedupID,
			},
		}
		h := &handle{src: s, raw: raw, id: "m-1", group: group}
		now := time.Unix(1700000000, 0)
		m := s.message(h, now)

		want := 1
		if n, err := strconv.Atoi(receiveCount); err == nil && n > 0 {
			want = n
		}
		if m.Attempt != want || m.Attempt < 1 || m.Redelivered != (m.Attempt > 1) {
			t.Fatalf("attempt %d (redelivered %v) from receive count %q", m.Attempt, m.Redelivered, receiveCount)
		}
		if m.ID != "m-1" || string(m.Body) != body || m.Topic != "orders" || consumer.DeliveryOf(m).Handle != h || !m.ReceivedAt.Equal(now) {
			t.Fatalf("message fields do not match: %+v", m)
		}
		for name, v := range raw.MessageAttributes {
			got, ok := m.Headers[name]
			if (v.StringValue != nil) != ok || (ok && got != *v.StringValue) {
				t.Fatalf("header %q = %q (%v) from %+v", name, got, ok, v)
			}
		}
		if len(m.Headers) > len(raw.MessageAttributes) {
			t.Fatalf("%d headers from %d attributes", len(m.Headers), len(raw.MessageAttributes))
		}
		wantKey := m.Headers["idempotency-key"]
		if wantKey == "" && fifo {
			wantKey = dedupID
		}
		if m.Key != wantKey {
			t.Fatalf("key %q, want %q", m.Key, wantKey)
		}
		wantPart := group
		if !fifo {
			wantPart = m.Headers["pk"]
		}
		if m.PartitionKey != wantPart {
			t.Fatalf("partition key %q, want %q", m.PartitionKey, wantPart)
		}
	})
}

// FuzzDeadLetterAttributes checks the attributes of a dead letter: never more
// than SQS accepts, the reason bounded and cut on a UTF-8 boundary, every
// value it writes itself one that SQS accepts (not empty, only characters of
// the XML range), the key attribute kept first, and every copied attribute
// unchanged.
func FuzzDeadLetterAttributes(f *testing.F) {
	f.Add("idempotency-key;a;b", "k;1;2", uint16(0), "handler failed", 3)
	f.Add("a;b;c;d;e;f;g;h;i;j;k;idempotency-key", "1;2;3;4;5;6;7;8;9;10;11;key", uint16(5), strings.Repeat("é", 3000), 1)
	f.Add(consumer.MetaReason+";"+consumer.MetaAttempts, "forged;999", uint16(0), "", 0)
	f.Add("", "", uint16(0), "\xff\xfe", -1)
	f.Add("", "", uint16(0), "invalid input syntax for type integer: \"1\x01\"", 1)
	f.Add("", "", uint16(0), strings.Repeat("\x00", 2000)+"\ufffe", 2)
	f.Fuzz(func(t *testing.T, names, values string, binary uint16, reason string, attempts int) {
		s := fuzzSource(false)
		raw := types.Message{MessageId: aws.String("m-1"), Body: aws.String("b"), MessageAttributes: fuzzAttributes(names, values, binary)}
		h := &handle{src: s, raw: raw, id: "m-1"}
		var reasonErr error
		if reason != "" {
			reasonErr = &consumer.DeadLetterError{Key: "k", Attempts: attempts, Err: errors.New(reason)}
		}
		attrs := s.deadLetterAttributes(context.Background(), h, reasonErr, attempts, "k")

		if len(attrs) > MaxMessageAttributes {
			t.Fatalf("%d attributes, SQS accepts %d", len(attrs), MaxMessageAttributes)
		}
		r, ok := attrs[consumer.MetaReason]
		if !ok || r.StringValue == nil {
			t.Fatal("no reason attribute")
		}
		text := *r.StringValue
		if len(text) > maxReasonBytes || text == "" {
			t.Fatalf("reason of %d bytes, limit %d", len(text), maxReasonBytes)
		}
		if reasonErr != nil {
			full := metatext.Clean(reasonErr.Error(), 0)
			if !strings.HasPrefix(full, strings.TrimSuffix(text, truncatedSuffix(text))) {
				t.Fatalf("reason %q is not a prefix of %q", text, full)
			}
		}
		// What SQS accepts: String and Number values that are not empty
		// and hold only characters of the XML range.
		for _, name := range []string{consumer.MetaReason, consumer.MetaAttempts, MetaOriginQueue, MetaOriginMessageID} {
			v := aws.ToString(attrs[name].StringValue)
			if v == "" || !metatext.ValidString(v) {
				t.Fatalf("attribute %s = %q, which SQS refuses", name, v)
			}
		}
		a, ok := attrs[consumer.MetaAttempts]
		if !ok || a.StringValue == nil || *a.StringValue != strconv.Itoa(attempts) {
			t.Fatalf("attempts attribute %+v, want %d", a, attempts)
		}
		if src := attrs[MetaOriginQueue]; src.StringValue == nil || *src.StringValue != s.cfg.QueueURL {
			t.Fatalf("source queue attribute %+v", src)
		}
		if id := attrs[MetaOriginMessageID]; id.StringValue == nil || *id.StringValue != "m-1" {
			t.Fatalf("message id attribute %+v", id)
		}
		// The key is recorded: in the key attribute, else in MetaKey.
		ours := map[string]bool{consumer.MetaReason: true, consumer.MetaAttempts: true, MetaOriginQueue: true, MetaOriginMessageID: true}
		if aws.ToString(raw.MessageAttributes[s.cfg.KeyAttribute].StringValue) != "k" {
			if k := attrs[consumer.MetaKey]; aws.ToString(k.StringValue) != "k" {
				t.Fatalf("key attribute %s = %+v, want k", consumer.MetaKey, k)
			}
			ours[consumer.MetaKey] = true
		}
		for name, v := range attrs {
			if ours[name] {
				continue
			}
			orig, ok := raw.MessageAttributes[name]
			if !ok {
				t.Fatalf("attribute %q was not on the original", name)
			}
			if aws.ToString(v.DataType) != aws.ToString(orig.DataType) || aws.ToString(v.StringValue) != aws.ToString(orig.StringValue) ||
				string(v.BinaryValue) != string(orig.BinaryValue) {
				t.Fatalf("attribute %q changed from %+v to %+v", name, orig, v)
			}
		}
		if _, had := raw.MessageAttributes["idempotency-key"]; had {
			if _, kept := attrs["idempotency-key"]; !kept {
				t.Fatal("the key attribute was dropped while others were kept")
			}
		}
	})
}

// truncatedSuffix returns the marker a shortened reason may end with, if
// text ends with one.
func truncatedSuffix(text string) string {
	for _, s := range []string{" ...(truncated)", "...(truncated)", "…"} {
		if strings.HasSuffix(text, s) {
			return s
		}
	}
	return ""
}

// FuzzParseMaxReceiveCount checks parseMaxReceiveCount against a plain JSON
// decoding: an accepted policy holds that positive maxReceiveCount, as a
// number or a decimal string.
func FuzzParseMaxReceiveCount(f *testing.F) {
	for _, s := range []string{
		`{"deadLetterTargetArn":"arn:aws:sqs:elasticmq:000000000000:dlq","maxReceiveCount":5}`,
		`{"maxReceiveCount":"5"}`, `{"maxReceiveCount":0}`, `{"maxReceiveCount":-1}`, `{"maxReceiveCount":1.5}`,
		`{"maxReceiveCount":"\"5\""}`, `{"maxReceiveCount":99999999999999999999}`, `{}`, `null`, `[]`, ``, `{"maxReceiveCount":null}`,
		`{"maxReceiveCount":true}`, `{"maxReceiveCount":"+7"}`, `{"MaxReceiveCount":3}`, `{"maxReceiveCount":5,"maxReceiveCount":6}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, policy string) {
		n, err := parseMaxReceiveCount(policy)
		if err != nil {
			if n != 0 {
				t.Fatalf("parseMaxReceiveCount(%q) = %d with error %v", policy, n, err)
			}
			return
		}
		if n < 1 {
			t.Fatalf("parseMaxReceiveCount(%q) = %d", policy, n)
		}
		var p struct {
			MaxReceiveCount any `json:"maxReceiveCount"`
		}
		if !json.Valid([]byte(policy)) {
			t.Fatalf("accepted a policy that is not JSON: %q", policy)
		}
		dec := json.NewDecoder(strings.NewReader(policy))
		dec.UseNumber() // a float64 would round counts above 2^53
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("accepted a policy encoding/json rejects: %q: %v", policy, err)
		}
		var want int
		switch v := p.MaxReceiveCount.(type) {
		case json.Number:
			w, err := strconv.Atoi(v.String())
			if err != nil {
				t.Fatalf("accepted maxReceiveCount %s, not an integer, as %d", v, n)
			}
			want = w
		case string:
			w, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("accepted maxReceiveCount %q as %d", v, n)
			}
			want = w
		default:
			t.Fatalf("accepted maxReceiveCount %#v (%T) as %d", v, v, n)
		}
		if want != n {
			t.Fatalf("parseMaxReceiveCount(%q) = %d, want %d", policy, n, want)
		}
	})
}
