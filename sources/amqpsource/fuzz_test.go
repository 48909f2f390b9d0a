package amqpsource

import (
	"encoding/hex"
	"math"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// headerValue builds an AMQP table value of the type kind selects, from s and
// n: every type a client library can put in a header.
func headerValue(kind uint8, s string, n int64) any {
	switch kind % 18 {
	case 0:
		return s
	case 1:
		return []byte(s)
	case 2:
		return n%2 == 0
	case 3:
		return time.Unix(n%(1<<40), 0)
	case 4:
		return int8(n)
	case 5:
		return int16(n)
	case 6:
		return int32(n)
	case 7:
		return n
	case 8:
		return int(n)
	case 9:
		return uint8(n)
	case 10:
		return uint16(n)
	case 11:
		return uint32(n)
	case 12:
		return uint64(n)
	case 13:
		return float64(n) / 3
	case 14:
		return amqp.Decimal{Scale: uint8(n), Value: int32(n >> 8)}
	case 15:
		return amqp.Table{"nested": s}
	case 16:
		return []any{s, n}
	}
	return nil
}

// FuzzHeaderReaders checks stringHeader and intHeader against the value's
// own formatting and parsing: integers round-trip, strings are kept as they
// are, and only the documented types are read.
func FuzzHeaderReaders(f *testing.F) {
	for kind := range uint8(18) {
		f.Add(kind, "7", int64(7))
	}
	f.Add(uint8(0), "9223372036854775807", int64(-1))
	f.Add(uint8(1), "-9223372036854775808", int64(math.MinInt64))
	f.Add(uint8(12), "", int64(-1))
	f.Add(uint8(0), "+3", int64(0))
	f.Add(uint8(0), "\xff\x00", int64(0))
	f.Fuzz(func(t *testing.T, kind uint8, s string, n int64) {
		v := headerValue(kind, s, n)
		str, sok := stringHeader(v)
		num, nok := intHeader(v)
		switch v := v.(type) {
		case string:
			if !sok || str != v {
				t.Fatalf("stringHeader(%q) = %q, %v", v, str, sok)
			}
		case []byte:
			if !sok || str != string(v) {
				t.Fatalf("stringHeader(%q) = %q, %v", v, str, sok)
			}
		case amqp.Table, []any, nil:
			if sok || nok {
				t.Fatalf("read a %T header as a scalar: %q %d", v, str, num)
			}
			if str != "" || num != 0 {
				t.Fatalf("a value not read is not zero: %q %d", str, num)
			}
		default:
			if !sok || str == "" {
				t.Fatalf("stringHeader(%#v) = %q, %v", v, str, sok)
			}
		}
		if !nok {
			if num != 0 {
				t.Fatalf("intHeader(%#v) = %d without ok", v, num)
			}
			return
		}
		// Every integer read has a string form that parses back to it, unless
		// it was clamped from a uint64 above 1<<62.
		if p, err := strconv.ParseInt(str, 10, 64); sok && err == nil && p != num {
			if u, ok := v.(uint64); !ok || u <= 1<<62 || num != 1<<62 {
				t.Fatalf("intHeader(%#v) = %d, its string form %q", v, num, str)
			}
		}
		if u, ok := v.(uint64); ok && (num < 0 || (u <= 1<<62 && uint64(num) != u)) {
			t.Fatalf("intHeader(uint64 %d) = %d", u, num)
		}
	})
}

// FuzzToMessage checks toMessage on deliveries with hostile headers: the
// attempt count is at least 1 whatever the retry and delivery-count headers
// say, the key follows the documented order (header, message id, body hash),
// and only scalar headers are copied.
func FuzzToMessage(f *testing.F) {
	f.Add("key-1", uint8(0), "msg-1", []byte("body"), uint8(7), int64(2), uint8(7), int64(1), false, true)
	f.Add("", uint8(0), "", []byte("body"), uint8(0), int64(0), uint8(0), int64(0), true, false)
	f.Add("", uint8(15), "", []byte(nil), uint8(0), int64(0), uint8(0), int64(0), false, false)
	f.Add("k", uint8(1), "id", []byte("b"), uint8(0), int64(0), uint8(0), int64(0), true, true)
	f.Add("9223372036854775807", uint8(0), "id", []byte("b"), uint8(0), int64(0), uint8(12), int64(-1), false, false)
	f.Add("x", uint8(0), "id", []byte("b"), uint8(7), int64(math.MaxInt64), uint8(7), int64(math.MaxInt64), false, false)
	f.Add("x", uint8(0), "id", []byte("b"), uint8(0), int64(0), uint8(7), int64(math.MinInt64), false, false)
	f.Fuzz(func(t *testing.T, keyStr string, keyKind uint8, msgID string, body []byte,
		retriesKind uint8, retries int64, countKind uint8, count int64, bodyHash, partitioned bool) {
		cfg := Config{Queue: "q", KeyHeader: "k", BodyHashKey: bodyHash}
		if partitioned {
			cfg.PartitionKeyHeader = "p"
		}
		s := &Source{cfg: cfg}
		headers := amqp.Table{
			"k":                 headerValue(keyKind, keyStr, retries),
			HeaderRetries:       headerValue(retriesKind, keyStr, retries),
			headerDeliveryCount: headerValue(countKind, keyStr, count),
			"p":                 headerValue(keyKind+1, keyStr, count),
			"x-death":           []any{amqp.Table{"count": int64(3)}},
		}
		d := amqp.Delivery{MessageId: msgID, Body: body, Headers: headers, DeliveryTag: 9}
		now := time.Unix(1700000000, 0)
		m := s.toMessage(nil, d, now)

		if m.Attempt < 1 {
			t.Fatalf("attempt %d: retries %#v, delivery count %#v", m.Attempt, headers[HeaderRetries], headers[headerDeliveryCount])
		}
		if r, ok := intHeader(headers[HeaderRetries]); ok && r > 0 && !m.Redelivered {
			t.Fatalf("retries %d but not marked redelivered", r)
		}
		if m.ID != msgID || string(m.Body) != string(body) || m.Topic != "q" || !m.ReceivedAt.Equal(now) {
			t.Fatalf("message fields changed: %+v", m)
		}
		hk, _ := stringHeader(headers["k"])
		switch {
		case hk != "":
			if m.Key != hk {
				t.Fatalf("key %q, want the header's %q", m.Key, hk)
			}
		case msgID != "":
			if m.Key != msgID {
				t.Fatalf("key %q, want the message id %q", m.Key, msgID)
			}
		case bodyHash:
			h := dedup.HashPayload(body)
			if m.Key != bodyHashPrefix+hex.EncodeToString(h[:]) {
				t.Fatalf("key %q is not the body hash", m.Key)
			}
		default:
			if m.Key != "" {
				t.Fatalf("key %q without a header, id or body hash", m.Key)
			}
		}
		if len(m.Headers) > len(headers) {
			t.Fatalf("%d headers from %d", len(m.Headers), len(headers))
		}
		for name, v := range headers {
			want, ok := stringHeader(v)
			got, present := m.Headers[name]
			if ok != present || got != want {
				t.Fatalf("header %q = %q (%v), want %q (%v)", name, got, present, want, ok)
			}
		}
		wantPart := ""
		if partitioned {
			wantPart, _ = stringHeader(headers["p"])
		}
		if m.PartitionKey != wantPart {
			t.Fatalf("partition key %q, want %q", m.PartitionKey, wantPart)
		}
		h, ok := consumer.DeliveryOf(m).Handle.(*handle)
		if !ok || h.tag != 9 || h.attempt != m.Attempt || h.src != s {
			t.Fatalf("handle %+v does not match the delivery", consumer.DeliveryOf(m).Handle)
		}
	})
}
