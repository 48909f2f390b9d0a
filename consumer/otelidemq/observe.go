package otelidemq

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// observeTimeout bounds one read of an observed value (a request to the
// broker or the database) during a metrics collection.
const observeTimeout = 5 * time.Second

// ObserveLag exports src's lag per partition as the idemq.kafka.lag gauge,
// with the attributes docs/observability.md lists. The lag is read from src
// at each metrics collection (kafkasource: one request to the brokers,
// bounded by 5 s); a failed read is reported to the SDK's error handler and
// observes nothing. Unregister the returned registration when src closes.
func (h *Hook) ObserveLag(src consumer.LagReporter) (metric.Registration, error) {
	reg, err := h.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, observeTimeout)
		defer cancel()
		lags, err := src.Lag(ctx)
		if err != nil {
			return fmt.Errorf("otelidemq: read the lag: %w", err)
		}
		for _, l := range lags {
			system := h.system
			if system == "" {
				system = cmp.Or(l.System, systemUnknown)
			}
			kvs := []attribute.KeyValue{AttrSystem.String(system), AttrDestination.String(l.Topic), AttrPartition.String(strconv.Itoa(l.Partition))}
			if h.group != "" {
				kvs = append(kvs, AttrConsumerGroup.String(h.group))
			}
			o.ObserveInt64(h.lag, l.Lag, metric.WithAttributeSet(attribute.NewSet(kvs...)))
		}
		return nil
	}, h.lag)
	if err != nil {
		return nil, fmt.Errorf("otelidemq: observe the lag: %w", err)
	}
	return reg, nil
}

// ObserveDedup exports the janitor's latest measurement of store's table
// (pgdedup and sqldedup: RunJanitor measures every StatsInterval) as the
// gauges idemq.dedup.records and idemq.dedup.oldest_age per scope. A
// collection reads the stored measurement and sends nothing to the
// database; before the first measurement nothing is observed. Unregister
// the returned registration when the store is no longer used.
func (h *Hook) ObserveDedup(store dedup.TableStatsReporter) (metric.Registration, error) {
	reg, err := h.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st, ok := store.TableStats()
		if !ok {
			return nil
		}
		for _, sc := range st.Scopes {
			opt := metric.WithAttributeSet(attribute.NewSet(AttrScope.String(sc.Scope)))
			o.ObserveInt64(h.dedupRecords, sc.Records, opt)
			o.ObserveFloat64(h.dedupOldest, max(st.At.Sub(sc.Oldest), 0).Seconds(), opt)
		}
		return nil
	}, h.dedupRecords, h.dedupOldest)
	if err != nil {
		return nil, fmt.Errorf("otelidemq: observe the dedup table: %w", err)
	}
	return reg, nil
}
