package sqssource

import (
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
)

func TestFitDeadLetter(t *testing.T) {
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	full := func() map[string]types.MessageAttributeValue {
		return map[string]types.MessageAttributeValue{
			consumer.MetaReason:   str(strings.Repeat("r", 1000)),
			consumer.MetaAttempts: {DataType: aws.String("Number"), StringValue: aws.String("5")},
			MetaOriginQueue:       str("http://127.0.0.1:9324/000000000000/orders"),
			MetaOriginMessageID:   str("0f6c1b9e-6f8e-4a53-9d57-3d9d1f2a0c11"),
			"key":                 str("order-1"),
			"big":                 str(strings.Repeat("x", 500)),
			"small":               str("y"),
		}
	}
	size := messageSize("", full())
	reasonSize := attributeSize(consumer.MetaReason, full()[consumer.MetaReason])
	cases := []struct {
		name      string
		body      int
		wantDrop  []string
		wantCut   bool
		wantFits  bool
		wantAttrs []string
	}{
		{"fits", MaxMessageSize - size, nil, false, true, nil},
		{"reason cut, nothing dropped", MaxMessageSize - size + 100, nil, true, true, nil},
		{"original's largest attribute dropped first", MaxMessageSize - size + 1000, []string{"big"}, true, true, nil},
		{"everything but a short reason", MaxMessageSize - (reasonSize - 1000 + 20), []string{"big", "small", "key", MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts}, true, true, []string{consumer.MetaReason}},
		{"body alone", MaxMessageSize, []string{"big", "small", "key", MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts, consumer.MetaReason}, false, true, []string{}},
		{"too large", MaxMessageSize + 1, []string{"big", "small", "key", MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts, consumer.MetaReason}, false, false, []string{}},
	}
	for _, c := range cases {
		attrs := full()
		body := strings.Repeat("b", c.body)
		dropped, cut, fits := fitDeadLetter(body, attrs, "key", MaxMessageSize)
		if fits != c.wantFits || cut != c.wantCut || !slices.Equal(dropped, c.wantDrop) {
			t.Errorf("%s: dropped %v cut %v fits %v, want %v %v %v", c.name, dropped, cut, fits, c.wantDrop, c.wantCut, c.wantFits)
		}
		if fits && messageSize(body, attrs) > MaxMessageSize {
			t.Errorf("%s: %d bytes after fitting", c.name, messageSize(body, attrs))
		}
		if r, ok := attrs[consumer.MetaReason]; ok && !strings.HasPrefix(strings.Repeat("r", 1000), aws.ToString(r.StringValue)) || ok && aws.ToString(r.StringValue) == "" {
			t.Errorf("%s: reason %q", c.name, aws.ToString(r.StringValue))
		}
		if c.wantAttrs != nil {
			var names []string
			for n := range attrs {
				names = append(names, n)
			}
			if len(names) != len(c.wantAttrs) || (len(names) == 1 && names[0] != c.wantAttrs[0]) {
				t.Errorf("%s: kept %v, want %v", c.name, names, c.wantAttrs)
			}
		}
	}
}
