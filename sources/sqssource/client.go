package sqssource

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/redact"
)

// What a client from NewClient uses for a local endpoint (LocalEndpoint)
// when nothing else is configured. Emulators accept any credentials;
// LocalStack keeps queues per region and maps the access key "test" to its
// default account.
const (
	LocalRegion          = "us-east-1"
	LocalAccessKeyID     = "test"
	LocalSecretAccessKey = "test"
)

// MaxRetryBackoff is the longest wait between two attempts of one call by a
// client from NewClient.
const MaxRetryBackoff = 500 * time.Millisecond

// NewClient returns an SQS client configured through the default
// aws-sdk-go-v2 chain, adjusted by optFns (for example config.WithRegion).
// A non-empty endpoint overrides the chain's endpoint (AWS_ENDPOINT_URL_SQS,
// AWS_ENDPOINT_URL, a profile's endpoint_url); one that is not an absolute
// URL is a *idemq.ConfigError, which shows it redacted (internal/redact).
//
// For a local endpoint (LocalEndpoint: an emulator), a region the chain
// leaves unset is LocalRegion, and credentials it would ask the EC2
// instance metadata service for are LocalAccessKeyID and
// LocalSecretAccessKey, so that no call waits for a metadata service that
// is not there; configured values win. For any other endpoint a missing
// region is a *idemq.ConfigError at once, naming AWS_REGION.
//
// The client's retries of a failed call wait at most MaxRetryBackoff
// between attempts (the SDK's default grows to 20 s), so that a call made
// while SQS is unreachable goes on within about that once it answers again.
func NewClient(ctx context.Context, endpoint string, optFns ...func(*config.LoadOptions) error) (*sqs.Client, error) {
	if endpoint != "" {
		// url.Parse's error, and the SDK's, quote the whole URL.
		const field = "sqssource.NewClient(endpoint)"
		u, err := url.Parse(endpoint)
		switch {
		case err != nil:
			return nil, &idemq.ConfigError{Field: field, Err: redact.URLError(err)}
		case u.Scheme == "" || u.Host == "":
			return nil, &idemq.ConfigError{Field: field, Reason: fmt.Sprintf("%q is not an absolute URL", redact.URL(u))}
		}
	}
	cfg, err := config.LoadDefaultConfig(ctx, optFns...)
	if err != nil {
		return nil, fmt.Errorf("sqssource: load AWS configuration: %w", err)
	}
	var base, region string
	c := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		// o.BaseEndpoint holds the chain's endpoint already.
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.Retryer = retry.AddWithMaxBackoffDelay(o.Retryer, MaxRetryBackoff)
		base = aws.ToString(o.BaseEndpoint)
		if LocalEndpoint(base) {
			if o.Region == "" {
				o.Region = LocalRegion
			}
			if o.Credentials == nil || aws.IsCredentialsProvider(o.Credentials, (*ec2rolecreds.Provider)(nil)) {
				o.Credentials = credentials.NewStaticCredentialsProvider(LocalAccessKeyID, LocalSecretAccessKey, "")
			}
		}
		region = o.Region
	})
	if region == "" {
		return nil, &idemq.ConfigError{Field: "sqssource.NewClient", Reason: fmt.Sprintf(
			"no AWS region for %s: set AWS_REGION (or a profile's region, or pass config.WithRegion); a local emulator's endpoint (localhost, a loopback address or a single-label host) needs none",
			cmp.Or(redact.String(base), "the AWS endpoint"))}
	}
	return c, nil
}

// LocalEndpoint reports whether endpoint is an SQS emulator's URL (ElasticMQ,
// LocalStack) rather than AWS's: its host is localhost or a name under
// .localhost, a loopback address, a single-label host name (a container or
// compose service such as "elasticmq"; AWS endpoints are never single
// labels) or a name under .localstack.cloud (LocalStack's own names).
func LocalEndpoint(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return false
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || strings.HasSuffix(host, ".localstack.cloud") ||
		(host != "" && !strings.Contains(host, "."))
}
