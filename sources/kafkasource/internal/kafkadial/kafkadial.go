// Package kafkadial derives, from the kafka.Dialer a user configures, the
// kafka.Transport that kafkasource and kafkadlq send their admin requests
// and produced messages through.
package kafkadial

import (
	"net"

	"github.com/segmentio/kafka-go"
)

// Transport returns a transport that connects as d does: its TLS, SASL
// mechanism, client id, timeout and dial function (or the net.Dialer
// settings) apply to every connection. d must not be nil.
func Transport(d *kafka.Dialer) *kafka.Transport {
	t := &kafka.Transport{
		ClientID:    d.ClientID,
		TLS:         d.TLS,
		SASL:        d.SASLMechanism,
		DialTimeout: d.Timeout,
	}
	if d.DialFunc != nil {
		t.Dial = d.DialFunc
	} else {
		nd := &net.Dialer{
			Timeout:       d.Timeout,
			Deadline:      d.Deadline,
			LocalAddr:     d.LocalAddr,
			FallbackDelay: d.FallbackDelay,
			KeepAlive:     d.KeepAlive,
		}
		t.Dial = nd.DialContext
	}
	return t
}
