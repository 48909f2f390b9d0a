package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"
)

// client shows what the Idempotency-Key is for: it sends a charge, loses
// the response (it hangs up as soon as the request is sent, as a 504 or a
// dropped connection would), and retries with the same key until it gets
// an answer: the charge the first attempt created, not a second one.
func client(args []string) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8088", "the server's base URL")
	account := fs.Int64("account", 7, "account to charge")
	amount := fs.Int64("amount", 500, "amount to charge")
	token := fs.String("token", "alice-token", "bearer token of the caller")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := hex.EncodeToString(b[:])
	body := fmt.Sprintf(`{"account": %d, "amount": %d}`, *account, *amount)
	fmt.Printf("POST /charges  Idempotency-Key: %s  %s\n", key, body)

	// Attempt 1: the request reaches the server, the response never
	// reaches us.
	ctx, cancel := context.WithCancel(context.Background())
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { cancel() }})
	_, err := post(ctx, *url, *token, key, body)
	cancel()
	fmt.Printf("attempt 1: response lost (%v)\n", err)

	// Retries with the same key, as a client does after a 504.
	for attempt := 2; attempt <= 20; attempt++ {
		time.Sleep(100 * time.Millisecond)
		res, err := post(context.Background(), *url, *token, key, body)
		if err != nil {
			fmt.Printf("attempt %d: %v\n", attempt, err)
			continue
		}
		if res.status == http.StatusConflict {
			fmt.Printf("attempt %d: 409, the first attempt is still running\n", attempt)
			continue
		}
		fmt.Printf("attempt %d: %d Idempotent-Replayed: %q\n%s", attempt, res.status, res.replayed, res.body)
		var c Charge
		if err := json.Unmarshal([]byte(res.body), &c); err == nil && c.ID != 0 {
			fmt.Printf("charge %d, created once; account %d balance %d\n", c.ID, c.Account, c.Balance)
		}
		return nil
	}
	return fmt.Errorf("no answer after 20 attempts")
}

type clientReply struct {
	status   int
	replayed string
	body     string
}

func post(ctx context.Context, base, token, key, body string) (clientReply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/charges", strings.NewReader(body))
	if err != nil {
		return clientReply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return clientReply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return clientReply{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"), body: string(b)}, err
}
