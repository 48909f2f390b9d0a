// Package morebrokers registers the SQS and RabbitMQ brokers of the checkout
// example with checkout.RegisterBroker. Import it for its side effect:
//
//	import _ "github.com/idemq/idemq/examples/checkout/morebrokers"
package morebrokers
