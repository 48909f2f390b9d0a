package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"

	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/consumer/dlq"
)

// A program mounts the console on its own mux, under a prefix, next to its
// health endpoints. Queue.Open opens a dead-letter store (kafkadlq.New,
// sqsdlq.New or amqpdlq.New in a real program); the token, from the
// environment in a real program, authorises replays and purges.
func Example() {
	store := &memStore{letters: []*dlq.Letter{
		{ID: "0/17", Key: "order-17", Reason: "bad SKU 17", Origin: "orders"},
		{ID: "0/18", Key: "order-18", Reason: "bad SKU 4", Origin: "orders"},
	}}
	c, err := console.New(console.Config{
		Prefix: "/idemq",
		Token:  "change-me",
		Queues: []console.Queue{{Name: "orders.dlq", Broker: "kafka", Open: func(ctx context.Context) (dlq.Broker, error) {
			return store.open(ctx)
		}}},
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	mux := http.NewServeMux()
	mux.Handle("/idemq/", c)

	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/idemq/dlq/orders.dlq", nil))
	fmt.Println(w.Code, regexp.MustCompile(`<title>(.*)</title>`).FindStringSubmatch(w.Body.String())[1])
	for _, m := range regexp.MustCompile(`data-reason="([^"]*)">[\s\S]*?data-sort="(\d+)"`).FindAllStringSubmatch(w.Body.String(), -1) {
		fmt.Printf("%s: %s\n", m[1], m[2])
	}
	// Output:
	// 200 orders.dlq — dead letters — idemq console
	// bad SKU &lt;n&gt;: 2
}
