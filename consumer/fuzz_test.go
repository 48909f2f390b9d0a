package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
)

// nopSource is a Source that is never read: the fuzz targets below call the
// runner's input checks directly, so none of its methods is called.
type nopSource struct{ Source }

// fuzzRunner returns a Runner built by NewRunner, as production code builds
// it, with keyFunc and a body limit.
func fuzzRunner(t *testing.T, keyFunc func(*Message) (string, error), maxBody int) *Runner {
	t.Helper()
	ms, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	path := Leased(ms.Leases(), func(context.Context, *Message) error { return nil }, LeaseOptions{})
	r, err := NewRunner(nopSource{}, path, Config{Name: "fuzz", KeyFunc: keyFunc, MaxMessageBytes: maxBody})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// FuzzValidKey checks that validKey accepts exactly the keys a store can hold
// and that every rejection is an ErrInvalidKey that the runner dead-letters.
func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"", "order-1", "a:b:c", "\x00", "a\x00b", "\xff", "é", "line\r\nbreak", "\t", strings.Repeat("k", MaxKeyBytes), strings.Repeat("k", MaxKeyBytes+1), strings.Repeat("é", MaxKeyBytes/2)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := validKey(key)
		if err == nil {
			if len(key) > MaxKeyBytes {
				t.Fatalf("accepted a key of %d bytes", len(key))
			}
			if !utf8.ValidString(key) {
				t.Fatalf("accepted invalid UTF-8 %q", key)
			}
			if strings.ContainsFunc(key, unicode.IsControl) {
				t.Fatalf("accepted a control character (NUL, CR, LF, ...) in %q", key)
			}
			return
		}
		if !errors.Is(err, ErrInvalidKey) || !IsPermanent(err) {
			t.Fatalf("validKey(%q) = %v: not a permanent ErrInvalidKey", key, err)
		}
		// The error names the problem, not the key: a hostile key must not
		// grow the log line.
		if len(err.Error()) > 200 {
			t.Fatalf("error of %d bytes for a key of %d bytes", len(err.Error()), len(key))
		}
		// A key of printable characters (letters, digits, punctuation,
		// symbols, spaces) within the size limit is never refused.
		if len(key) <= MaxKeyBytes && utf8.ValidString(key) && !strings.ContainsFunc(key, notPrintable) {
			t.Fatalf("rejected a valid key %q: %v", key, err)
		}
	})
}

func notPrintable(r rune) bool { return !unicode.IsPrint(r) }

// FuzzPrepare checks the runner's input checks end to end: a message either
// gets a valid key equal to KeyFunc's and the digest of its body, or a
// permanent error of the input kind (a KeyFunc's error or panic, and a key
// the source could not read, are ErrMissingKey), and the message is never
// modified.
func FuzzPrepare(f *testing.F) {
	f.Add("k1", "id-1", []byte(`{"amount":1}`), 0, false)
	f.Add("", "id-1", []byte("x"), 0, false)
	f.Add("", "", []byte("x"), 0, false)
	f.Add("k\x00", "id", []byte{}, 0, false)
	f.Add("k\r\n", "id", []byte{}, 0, false)
	f.Add("k", "id", []byte("0123456789"), 5, false)
	f.Add("k", "id", []byte("body"), 0, true)
	f.Add("k", "odd", []byte("body"), 0, true)
	f.Add("k", "four", []byte("body"), 0, false)
	f.Add("\xc3\x28", "", []byte(nil), 1, false)
	runners := map[[2]int]*Runner{}
	f.Fuzz(func(t *testing.T, key, id string, body []byte, maxBody int, keyErr bool) {
		if maxBody < 0 {
			maxBody = -maxBody
		}
		if maxBody < 0 { // math.MinInt
			maxBody = 0
		}
		maxBody %= 64 // a few limits, each runner built once
		// The KeyFunc: the default; one that fails; one that panics (an id
		// of odd length picks it).
		mode := 0
		if keyErr {
			mode = 1 + len(id)%2
		}
		keyFunc := DefaultKey
		switch mode {
		case 1:
			keyFunc = func(m *Message) (string, error) { return m.Key, errors.New("no key here") }
		case 2:
			keyFunc = func(m *Message) (string, error) { panic("malformed message") }
		}
		rk := [2]int{maxBody, mode}
		r := runners[rk]
		if r == nil {
			r = fuzzRunner(t, keyFunc, maxBody)
			runners[rk] = r
		}
		orig := append([]byte(nil), body...)
		msg := &Message{ID: id, Key: key, Body: body, Attempt: 1}
		sourceKeyErr := !keyErr && len(id) == 4 // the source could not read the key
		if sourceKeyErr {
			Deliver(msg, Delivery{KeyErr: errors.New("header not UTF-8")})
		}
		j := &job{msg: msg}
		err := r.prepare(j)
		if msg.Key != key || msg.ID != id || string(msg.Body) != string(orig) {
			t.Fatal("prepare modified the message")
		}
		limit := r.cfg.MaxMessageBytes
		want := ""
		if mode == 0 {
			want, _ = DefaultKey(msg)
		}
		if err != nil {
			if !IsPermanent(err) {
				t.Fatalf("prepare: %v is not a permanent input error", err)
			}
			if j.hash != (dedup.Hash{}) {
				t.Fatal("a rejected message got a digest")
			}
			var pe *PanicError
			switch {
			case errors.Is(err, ErrOversized):
				if len(body) <= limit {
					t.Fatalf("oversized error for %d bytes, limit %d", len(body), limit)
				}
			case errors.Is(err, ErrMissingKey):
				if mode == 2 && !errors.As(err, &pe) {
					t.Fatalf("a KeyFunc's panic gave %v, want a *PanicError", err)
				}
				if mode == 0 && !sourceKeyErr && want != "" {
					t.Fatalf("missing key error for key %q", want)
				}
			case errors.Is(err, ErrInvalidKey):
				if mode != 0 || validKey(want) == nil {
					t.Fatalf("invalid key error for the valid key %q", want)
				}
			default:
				t.Fatalf("prepare: unexpected error kind %v", err)
			}
			return
		}
		if mode != 0 || sourceKeyErr || len(body) > limit {
			t.Fatalf("accepted a message it should reject (KeyFunc %d, source key error %v, %d bytes, limit %d)",
				mode, sourceKeyErr, len(body), limit)
		}
		if j.key != want || validKey(j.key) != nil {
			t.Fatalf("key %q, want the valid key %q", j.key, want)
		}
		if j.hash != dedup.HashPayload(orig) {
			t.Fatal("hash is not the digest of the body")
		}
	})
}

// fuzzOrder is a typical handler payload.
type fuzzOrder struct {
	ID     string            `json:"id"`
	Amount int64             `json:"amount"`
	Items  []string          `json:"items"`
	Meta   map[string]string `json:"meta"`
	Paid   *bool             `json:"paid"`
}

// FuzzDecodeJSON checks that decodeJSON either decodes a body exactly as
// encoding/json does, or fails with a permanent ErrMalformed.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"id":"o-1","amount":42,"items":["a","b"],"meta":{"k":"v"},"paid":true}`,
		`{}`, `null`, `[]`, `"str"`, `{"amount":1e400}`, `{"amount":"1"}`, `{"id":"\ud800"}`,
		`{"id":1`, ``, `{"items":[null]}`, "\xef\xbb\xbf{}", `{"ID":"case"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		msg := &Message{Body: body}
		got, err := decodeJSON[fuzzOrder](msg)
		var want fuzzOrder
		wantErr := json.Unmarshal(body, &want)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("decodeJSON error %v, encoding/json error %v", err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) || !IsPermanent(err) {
				t.Fatalf("decodeJSON error %v is not a permanent ErrMalformed", err)
			}
			var se *json.SyntaxError
			var te *json.UnmarshalTypeError
			if !errors.As(err, &se) && !errors.As(err, &te) {
				t.Fatalf("decodeJSON error %v does not wrap the decoder's", err)
			}
			return
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(want)
		if string(a) != string(b) {
			t.Fatalf("decoded %s, encoding/json decoded %s", a, b)
		}
		// Round trip: what was decoded encodes and decodes to itself.
		var again fuzzOrder
		if err := json.Unmarshal(a, &again); err != nil {
			t.Fatalf("re-decoding %s: %v", a, err)
		}
		if c, _ := json.Marshal(again); string(c) != string(a) {
			t.Fatalf("round trip changed %s into %s", a, c)
		}
	})
}
