package kafkasource_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// String names the bootstrap addresses, the topics and the group for the
// Runner's start line.
func TestSourceString(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	src := openSource(t, testConfig(t, brokers, topic, topic+"-group"))
	s, ok := any(src).(fmt.Stringer)
	if !ok {
		t.Fatal("*kafkasource.Source has no String method")
	}
	got := s.String()
	for _, want := range []string{"kafka", brokers[0], "topics=" + topic, "group=" + topic + "-group"} {
		if !strings.Contains(got, want) {
			t.Errorf("String() = %q, lacks %q", got, want)
		}
	}
}
