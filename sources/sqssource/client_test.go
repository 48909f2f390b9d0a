package sqssource_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sqssource"
)

// bareAWSEnv leaves the process no AWS configuration but set (every AWS_
// variable of the configuration chain unset, no shared files), with the
// EC2 instance metadata service at a local server that counts the requests
// it gets and answers none, and returns that count.
func bareAWSEnv(t *testing.T, set map[string]string) *atomic.Int64 {
	t.Helper()
	var imds atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		imds.Add(1)
		http.Error(w, "no instance here", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	none := filepath.Join(t.TempDir(), "none")
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
		"AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_EC2_METADATA_DISABLED", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"} {
		t.Setenv(k, "")
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("AWS_CONFIG_FILE", none)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", none)
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", srv.URL)
	for k, v := range set {
		t.Setenv(k, v)
	}
	return &imds
}

// With a local endpoint and nothing else configured, NewClient's client
// works against the emulator: the local region and credentials, and no
// instance metadata request.
func TestNewClientLocalEndpoint(t *testing.T) {
	endpoint := testenv.SQSEndpoint(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		arg  string
	}{
		{"AWS_ENDPOINT_URL_SQS", map[string]string{"AWS_ENDPOINT_URL_SQS": endpoint}, ""},
		{"AWS_ENDPOINT_URL", map[string]string{"AWS_ENDPOINT_URL": endpoint}, ""},
		{"argument", nil, endpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			imds := bareAWSEnv(t, tc.env)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := sqssource.NewClient(ctx, tc.arg)
			if err != nil {
				t.Fatalf("NewClient: %v", err)
			}
			if _, err := c.ListQueues(ctx, &sqs.ListQueuesInput{}); err != nil {
				t.Errorf("ListQueues: %v", err)
			}
			if n := imds.Load(); n != 0 {
				t.Errorf("the instance metadata service got %d requests, want none", n)
			}
			if o := c.Options(); o.Region != sqssource.LocalRegion {
				t.Errorf("region %q, want %q", o.Region, sqssource.LocalRegion)
			}
		})
	}
	// What is configured wins over the local defaults.
	t.Run("configured", func(t *testing.T) {
		bareAWSEnv(t, map[string]string{"AWS_ENDPOINT_URL_SQS": endpoint, "AWS_REGION": "eu-west-1",
			"AWS_ACCESS_KEY_ID": "AKIDLOCAL", "AWS_SECRET_ACCESS_KEY": "secret"})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := sqssource.NewClient(ctx, "")
		if err != nil {
			t.Fatalf("NewClient: %v", err)
		}
		creds, err := c.Options().Credentials.Retrieve(ctx)
		if err != nil || creds.AccessKeyID != "AKIDLOCAL" || c.Options().Region != "eu-west-1" {
			t.Errorf("credentials %q (%v), region %q; want the configured ones", creds.AccessKeyID, err, c.Options().Region)
		}
	})
}

// Without a region, NewClient fails at once for an endpoint that is not
// local, with an error that says what to set.
func TestNewClientNeedsRegion(t *testing.T) {
	for _, endpoint := range []string{"", "https://sqs.internal.example.com"} {
		bareAWSEnv(t, nil)
		_, err := sqssource.NewClient(context.Background(), endpoint)
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Fatalf("NewClient(%q) without a region: %v, want a *idemq.ConfigError", endpoint, err)
		}
		t.Logf("NewClient(%q): %v", endpoint, err)
	}
}

func TestLocalEndpoint(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		want     bool
	}{
		{"http://127.0.0.1:9324", true},
		{"http://localhost:4566", true},
		{"http://[::1]:9324", true},
		{"http://127.0.0.2:9324", true},
		{"http://elasticmq:9324", true},
		{"https://localhost.localstack.cloud:4566", true},
		{"http://sqs.localhost", true},
		{"", false},
		{"https://sqs.eu-west-1.amazonaws.com", false},
		{"https://vpce-0123.sqs.eu-west-1.vpce.amazonaws.com", false},
		{"http://10.0.0.5:9324", false},
		{"https://sqs.internal.example.com", false},
		{"not a url", false},
	} {
		if got := sqssource.LocalEndpoint(tc.endpoint); got != tc.want {
			t.Errorf("LocalEndpoint(%q) = %v, want %v", tc.endpoint, got, tc.want)
		}
	}
}
