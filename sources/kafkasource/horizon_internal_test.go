package kafkasource

import (
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
)

func TestHorizonOf(t *testing.T) {
	topic := func(name, ms string) kafka.DescribeConfigResponseResource {
		r := kafka.DescribeConfigResponseResource{ResourceName: name}
		if ms != "" {
			r.ConfigEntries = []kafka.DescribeConfigResponseConfigEntry{{ConfigName: "retention.ms", ConfigValue: ms}}
		}
		return r
	}
	for _, c := range []struct {
		name    string
		in      []kafka.DescribeConfigResponseResource
		want    time.Duration
		wantErr bool
	}{
		{"longest topic wins", []kafka.DescribeConfigResponseResource{topic("a", "3600000"), topic("b", "604800000")}, 7 * 24 * time.Hour, false},
		{"not reported is Kafka's default", []kafka.DescribeConfigResponseResource{topic("a", "")}, DefaultTopicRetention, false},
		{"for ever", []kafka.DescribeConfigResponseResource{topic("a", "3600000"), topic("b", "-1")}, consumer.Unbounded, false},
		{"garbage", []kafka.DescribeConfigResponseResource{topic("a", "soon")}, 0, true},
		{"topic error", []kafka.DescribeConfigResponseResource{{ResourceName: "a", Error: errors.New("unknown topic")}}, 0, true},
	} {
		got, err := horizonOf(c.in)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("%s: horizonOf = %v, %v; want %v (error %v)", c.name, got, err, c.want, c.wantErr)
		}
	}
}
