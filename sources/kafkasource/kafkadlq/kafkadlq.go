// Package kafkadlq is the dlq.Broker of a Kafka dead-letter topic
// (kafkasource's "<topic>.dlq").
//
// A topic is a log: a dead letter cannot be deleted from it. What was
// replayed or purged is recorded per partition and per progress name
// (Config.Group), after every in-sync replica acknowledged each replayed
// copy, in the compacted progress topic (Config.ProgressTopic), and
// mirrored as the committed offsets of the consumer group Config.Group. So
// a replay interrupted at any point goes on where it stopped when run
// again; at most the copy sent just before the interruption is sent again,
// and the runner absorbs it as a duplicate of its key. A replayed copy
// keeps its key: one whose message had no key header carries the key the
// runner recorded (consumer.MetaKey) in Config.KeyHeader.
// docs/operations.md ("Dead letters") describes the progress record.
package kafkadlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/internal/brokerkit"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/kafkasource/internal/kafkadial"
)

// DefaultGroup is the consumer group that records replay and purge progress
// when Config.Group is empty.
const DefaultGroup = "idemq-dlq"

// maxMetadataBytes bounds the list of done offsets kept in a commit's
// metadata, below Kafka's default offset.metadata.max.bytes (4096).
const maxMetadataBytes = 3500

// metadataPrefix starts the metadata of the commits this package makes.
const metadataPrefix = "idemq-dlq/1:"

// ErrProgressNotDurable reports a progress topic (Config.ProgressTopic)
// that Kafka may delete records of: its cleanup.policy is not "compact"
// and its retention.ms is not -1. A replay or purge refuses to record its
// progress there, since a progress record deleted by retention would have
// the dead letters it records listed and replayed again. Set the topic's
// cleanup.policy to compact, or name another topic.
var ErrProgressNotDurable = errors.New("kafkadlq: the progress topic deletes old records")

// ErrTooScattered reports a selection whose done offsets no longer fit in a
// commit's metadata, because too many dead letters before them were kept:
// replay or purge the earlier dead letters first.
var ErrTooScattered = errors.New("kafkadlq: too many kept dead letters before the selected ones to record the progress; replay or purge the earlier ones first")

// Config configures a Broker.
type Config struct {
	// Brokers are the bootstrap addresses. Required.
	Brokers []string
	// Topic is the dead-letter topic, for example "orders.dlq". Required.
	Topic string
	// KeyHeader is the header holding the deduplication key
	// (kafkasource.Config.KeyHeader), read when a dead letter has no
	// consumer.MetaKey, and written to a replayed copy that has none with
	// the key the runner recorded (consumer.MetaKey: the origin's
	// topic/partition/offset for a message that had no key of its own).
	// Defaults to kafkasource.DefaultKeyHeader.
	KeyHeader string
	// Group names the progress: what was replayed or purged under one
	// Group is done for that Group only. It is recorded in ProgressTopic
	// and mirrored as the committed offsets of the consumer group of this
	// name. Defaults to DefaultGroup.
	Group string
	// ProgressTopic is the compacted topic that records what was replayed
	// or purged. The first replay or purge creates it when it does not
	// exist (one partition, cleanup.policy=compact, as many replicas as the
	// cluster has brokers, up to 3); an existing one must keep its records
	// (ErrProgressNotDurable). Defaults to ProgressTopic(Topic).
	ProgressTopic string
	// Dialer opens every connection to the brokers: its TLS,
	// SASLMechanism, ClientID, Timeout and DialFunc (or net settings)
	// apply to the reads of dead letters and, unless Transport is set, to
	// the admin requests, the replayed copies and the progress records
	// too. Defaults to kafka.DefaultDialer.
	Dialer *kafka.Dialer
	// Transport, when set, carries the admin requests, the replayed
	// copies and the progress records instead of a transport made from
	// Dialer: it must then carry the same TLS and SASL settings itself. A
	// transport caches metadata: one given here does not know a topic
	// created after its last refresh (every MetadataTTL). Defaults to a
	// transport of the Broker's own made from Dialer, renewed at each Scan.
	Transport kafka.RoundTripper
	// Timeout bounds each request and each read of a dead letter. Defaults
	// to 10 s.
	Timeout time.Duration
}

// Broker reads and replays one dead-letter topic. It is not safe for
// concurrent use.
type Broker struct {
	cfg    Config
	own    *kafka.Transport // the transport New made, closed by Close
	client *kafka.Client
	writer *kafka.Writer
	// durable: the progress topic exists and keeps its records.
	durable bool
}

var _ dlq.Broker = (*Broker)(nil)

// New returns a Broker of cfg.Topic. It connects lazily.
func New(cfg Config) (*Broker, error) {
	l := cfgerr.List{Prefix: "kafkadlq.Config."}
	if len(cfg.Brokers) == 0 {
		l.Add("Brokers", "required")
	}
	if cfg.Topic == "" {
		l.Add("Topic", "required")
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	cfg.Group = cmp.Or(cfg.Group, DefaultGroup)
	cfg.ProgressTopic = cmp.Or(cfg.ProgressTopic, ProgressTopic(cfg.Topic))
	cfg.KeyHeader = cmp.Or(cfg.KeyHeader, kafkasource.DefaultKeyHeader)
	cfg.Dialer = cmp.Or(cfg.Dialer, kafka.DefaultDialer)
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	b := &Broker{cfg: cfg}
	if cfg.Transport == nil {
		b.own = kafkadial.Transport(cfg.Dialer)
		b.cfg.Transport = b.own
	}
	b.connect()
	return b, nil
}

// connect makes the client and the producer on b.cfg.Transport.
func (b *Broker) connect() {
	addr := kafka.TCP(b.cfg.Brokers...)
	b.client = &kafka.Client{Addr: addr, Timeout: b.cfg.Timeout, Transport: b.cfg.Transport}
	b.writer = &kafka.Writer{
		Addr:         addr,
		Transport:    b.cfg.Transport,
		RequiredAcks: kafka.RequireAll,
		Balancer:     originPartition{},
		BatchTimeout: time.Millisecond,
		WriteTimeout: b.cfg.Timeout,
		MaxAttempts:  3,
	}
}

// refresh replaces the Broker's own transport (none given in Config) by a
// new one made from the Dialer, whose metadata is the cluster's current
// one: a transport answers metadata from a cache, and would not know a
// progress topic that another process created since.
func (b *Broker) refresh() error {
	if b.own == nil {
		return nil
	}
	err := b.Close()
	b.own = kafkadial.Transport(b.cfg.Dialer)
	b.cfg.Transport = b.own
	b.connect()
	return err
}

// Close closes the producer of replayed copies and the idle connections.
func (b *Broker) Close() error {
	err := b.writer.Close()
	if b.own != nil {
		b.own.CloseIdleConnections()
	}
	return err
}

// partitionState is a partition's progress: every offset before committed
// is done, and so is every offset in done.
type partitionState struct {
	id          int
	committed   int64
	done        []int64 // sorted, all >= committed
	first, last int64   // the log's first offset and its end (next offset)
}

// Scan implements dlq.Broker: partition by partition, each from the
// recorded progress to the end the partition had when Scan began.
func (b *Broker) Scan(ctx context.Context, visit func(*dlq.Letter) dlq.Action) (int, error) {
	if err := b.refresh(); err != nil {
		return 0, fmt.Errorf("kafkadlq: close the producer: %w", err)
	}
	parts, err := b.partitions(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, p := range parts {
		n, stop, err := b.scanPartition(ctx, p, visit)
		total += n
		if err != nil || stop {
			return total, err
		}
	}
	return total, nil
}

// partitions reads the partitions of the topic and their progress.
func (b *Broker) partitions(ctx context.Context) ([]*partitionState, error) {
	md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{b.cfg.Topic}})
	if err != nil {
		return nil, fmt.Errorf("kafkadlq: metadata of %q: %w", b.cfg.Topic, err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		var terr error
		if len(md.Topics) == 1 {
			terr = md.Topics[0].Error
		}
		return nil, fmt.Errorf("kafkadlq: dead-letter topic %q: %w", b.cfg.Topic, errors.Join(errors.New("not found"), terr))
	}
	var ids []int
	for _, p := range md.Topics[0].Partitions {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	bounds, err := b.bounds(ctx, b.cfg.Topic, ids...)
	if err != nil {
		return nil, err
	}
	of, err := b.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: b.cfg.Group, Topics: map[string][]int{b.cfg.Topic: ids}})
	if err == nil {
		err = of.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafkadlq: committed offsets of group %q: %w", b.cfg.Group, err)
	}
	states := make(map[int]*partitionState, len(ids))
	for _, id := range ids {
		states[id] = &partitionState{id: id, first: bounds[id].FirstOffset, last: bounds[id].LastOffset}
	}
	for _, fp := range of.Topics[b.cfg.Topic] {
		if fp.Error != nil {
			return nil, fmt.Errorf("kafkadlq: committed offset of %q partition %d: %w", b.cfg.Topic, fp.Partition, fp.Error)
		}
		if s := states[fp.Partition]; s != nil {
			s.committed = fp.CommittedOffset
			s.done = parseDone(fp.Metadata)
		}
	}
	recs, err := b.readProgress(ctx)
	if err != nil {
		return nil, err
	}
	for id, r := range recs {
		if s := states[id]; s != nil {
			s.committed, s.done = r.Committed, slices.Sorted(slices.Values(r.Done))
		}
	}
	out := make([]*partitionState, 0, len(ids))
	for _, id := range ids {
		s := states[id]
		s.committed = max(s.committed, s.first)
		s.done = slices.DeleteFunc(s.done, func(o int64) bool { return o < s.committed })
		out = append(out, s)
	}
	return out, nil
}

// scanPartition visits the dead letters of one partition.
func (b *Broker) scanPartition(ctx context.Context, p *partitionState, visit func(*dlq.Letter) dlq.Action) (done int, stop bool, err error) {
	kept := false // a dead letter at or after p.committed was kept
	err = b.read(ctx, b.cfg.Topic, p.id, p.committed, p.last, func(m kafka.Message) (bool, error) {
		if slices.Contains(p.done, m.Offset) {
			if !kept {
				p.advance(m.Offset)
			}
			return true, nil
		}
		l := letterOf(m, b.cfg.KeyHeader)
		switch act := visit(l); act {
		case dlq.ActionStop:
			stop = true
			return false, nil
		case dlq.ActionReplay, dlq.ActionPurge:
			if kept && len(encodeDone(append(p.done, m.Offset))) > maxMetadataBytes {
				return false, fmt.Errorf("%w (partition %d, offset %d)", ErrTooScattered, p.id, m.Offset)
			}
			if err := b.ensureProgressTopic(ctx); err != nil {
				return false, err
			}
			if act == dlq.ActionReplay {
				if err := b.replay(ctx, m, l); err != nil {
					return false, err
				}
			}
			if kept {
				p.done = append(p.done, m.Offset)
			} else {
				p.advance(m.Offset)
			}
			if err := b.commit(ctx, p); err != nil {
				return false, err
			}
			done++
		default:
			kept = true
		}
		return true, nil
	})
	return done, stop, err
}

// read hands fn the messages of partition of topic from offset from to
// last (the partition's end when the caller looked), in order, until fn
// returns false or an error.
func (b *Broker) read(ctx context.Context, topic string, partition int, from, last int64, fn func(kafka.Message) (bool, error)) error {
	if from >= last {
		return nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: b.cfg.Brokers, Topic: topic, Partition: partition, Dialer: b.cfg.Dialer,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 200 * time.Millisecond,
	})
	defer r.Close()
	if err := r.SetOffset(from); err != nil {
		return fmt.Errorf("kafkadlq: seek %q partition %d: %w", topic, partition, err)
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		m, err := r.FetchMessage(rctx)
		cancel()
		if err != nil {
			return fmt.Errorf("kafkadlq: read %q partition %d at offset %d (end %d): %w", topic, partition, r.Offset(), last, err)
		}
		if m.Offset >= last {
			return nil
		}
		if more, err := fn(m); !more || err != nil {
			return err
		}
		if m.Offset+1 >= last {
			return nil
		}
	}
}

// advance records that everything up to offset is done.
func (p *partitionState) advance(offset int64) {
	p.committed = offset + 1
	p.done = slices.DeleteFunc(p.done, func(o int64) bool { return o < p.committed })
}

// commit records p's progress in the progress topic, then mirrors it as
// the group's committed offset.
func (b *Broker) commit(ctx context.Context, p *partitionState) error {
	rec := progressRecord{Topic: b.cfg.Topic, Group: b.cfg.Group, Partition: p.id, Committed: p.committed, Done: p.done}
	value, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("kafkadlq: encode progress: %w", err)
	}
	if err := b.writer.WriteMessages(ctx, kafka.Message{Topic: b.cfg.ProgressTopic, Partition: 0, Key: []byte(rec.key()), Value: value}); err != nil {
		return fmt.Errorf("kafkadlq: record progress in %q (%q partition %d, offset %d; the last copy was sent and will be sent again): %w",
			b.cfg.ProgressTopic, b.cfg.Topic, p.id, p.committed, err)
	}
	resp, err := b.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID: b.cfg.Group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{b.cfg.Topic: {{Partition: p.id, Offset: p.committed, Metadata: encodeDone(p.done)}}},
	})
	if err == nil {
		for _, c := range resp.Topics[b.cfg.Topic] {
			err = errors.Join(err, c.Error)
		}
	}
	if err != nil {
		return fmt.Errorf("kafkadlq: mirror the progress as the offsets of group %q (%q partition %d, offset %d; the progress is recorded in %q): %w",
			b.cfg.Group, b.cfg.Topic, p.id, p.committed, b.cfg.ProgressTopic, err)
	}
	return nil
}

// replay sends the copy of m to its origin and waits for every in-sync
// replica. The copy carries the key the runner recorded (consumer.MetaKey)
// in Config.KeyHeader when m has no such header.
func (b *Broker) replay(ctx context.Context, m kafka.Message, l *dlq.Letter) error {
	headers := make([]kafka.Header, 0, len(m.Headers)+1)
	keyed := false
	for _, h := range m.Headers {
		if !isMeta(h.Key) {
			headers = append(headers, h)
			keyed = keyed || h.Key == b.cfg.KeyHeader
		}
	}
	// A message without a key header was keyed by the runner on its
	// topic/partition/offset, which the copy does not share: the copy
	// carries that recorded key, so that a copy sent twice is absorbed.
	if rec := header(m, consumer.MetaKey); !keyed && rec != "" {
		headers = append(headers, kafka.Header{Key: b.cfg.KeyHeader, Value: []byte(rec)})
	}
	part := -1
	if v, err := strconv.Atoi(header(m, kafkasource.MetaOriginPartition)); err == nil {
		part = v
	}
	out := kafka.Message{Topic: l.Origin, Partition: part, Key: m.Key, Value: m.Value, Headers: headers}
	if err := b.writer.WriteMessages(ctx, out); err != nil {
		return fmt.Errorf("kafkadlq: replay %s to %q: %w", l.ID, l.Origin, err)
	}
	return nil
}

// originPartition writes a copy to its original partition when the topic
// still has it, so that it keeps its place among its key's messages, and
// else to the partition its key hashes to.
type originPartition struct{}

func (originPartition) Balance(m kafka.Message, partitions ...int) int {
	if slices.Contains(partitions, m.Partition) {
		return m.Partition
	}
	return (&kafka.Hash{}).Balance(m, partitions...)
}

// letterOf describes m, whose key is in keyHeader when it has no
// consumer.MetaKey.
func letterOf(m kafka.Message, keyHeader string) *dlq.Letter {
	l := brokerkit.Letter(fmt.Sprintf("%d/%d", m.Partition, m.Offset), m.Value, func(k string) string { return header(m, k) })
	l.Origin = header(m, kafkasource.MetaOriginTopic)
	if l.Key == "" {
		l.Key = header(m, keyHeader)
	}
	if l.DeadLetteredAt.IsZero() {
		l.DeadLetteredAt = m.Time
	}
	for _, h := range m.Headers {
		if !isMeta(h.Key) {
			l.Headers[h.Key] = string(h.Value)
		}
	}
	return l
}

// isMeta reports whether k is a header kafkasource.DeadLetter adds.
func isMeta(k string) bool {
	switch k {
	case consumer.MetaReason, consumer.MetaAttempts, kafkasource.MetaOriginTopic,
		kafkasource.MetaOriginPartition, kafkasource.MetaOriginOffset, kafkasource.MetaGroup,
		consumer.MetaKey, consumer.MetaDeadLetteredAt:
		return true
	}
	return false
}

// header returns the last value of header k of m.
func header(m kafka.Message, k string) string {
	v := ""
	for _, h := range m.Headers {
		if h.Key == k {
			v = string(h.Value)
		}
	}
	return v
}

func encodeDone(done []int64) string {
	if len(done) == 0 {
		return ""
	}
	parts := make([]string, len(done))
	for i, o := range done {
		parts[i] = strconv.FormatInt(o, 10)
	}
	return metadataPrefix + strings.Join(parts, ",")
}

func parseDone(md string) []int64 {
	rest, ok := strings.CutPrefix(md, metadataPrefix)
	if !ok || rest == "" {
		return nil
	}
	var out []int64
	for _, f := range strings.Split(rest, ",") {
		if o, err := strconv.ParseInt(f, 10, 64); err == nil {
			out = append(out, o)
		}
	}
	slices.Sort(out)
	return out
}

// ProgressTopic returns the default progress topic of dead-letter topic
// topic: topic + ".progress".
func ProgressTopic(topic string) string { return topic + ".progress" }

// progressRecord is the value of a progress topic record: in partition
// Partition of dead-letter topic Topic, every offset before Committed is
// done under Group, and so is every offset in Done.
type progressRecord struct {
	Topic     string  `json:"topic"`
	Group     string  `json:"group"`
	Partition int     `json:"partition"`
	Committed int64   `json:"committed"`
	Done      []int64 `json:"done,omitempty"`
}

// key is the record's key, which compaction keeps one record of. A topic
// name has no "/", a partition is a number: the key is unambiguous.
func (r progressRecord) key() string {
	return r.Topic + "/" + strconv.Itoa(r.Partition) + "/" + r.Group
}

// readProgress returns the last progress record of each partition of the
// dead-letter topic under the Broker's group; none when the progress topic
// does not exist.
func (b *Broker) readProgress(ctx context.Context) (map[int]progressRecord, error) {
	md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{b.cfg.ProgressTopic}})
	if err != nil {
		return nil, fmt.Errorf("kafkadlq: metadata of the progress topic %q: %w", b.cfg.ProgressTopic, err)
	}
	if len(md.Topics) != 1 || errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		return nil, nil
	}
	if err := md.Topics[0].Error; err != nil {
		return nil, fmt.Errorf("kafkadlq: progress topic %q: %w", b.cfg.ProgressTopic, err)
	}
	bounds, err := b.bounds(ctx, b.cfg.ProgressTopic, 0)
	if err != nil {
		return nil, err
	}
	po, ok := bounds[0]
	if !ok {
		return nil, fmt.Errorf("kafkadlq: offsets of the progress topic %q: no answer for partition 0", b.cfg.ProgressTopic)
	}
	out := map[int]progressRecord{}
	err = b.read(ctx, b.cfg.ProgressTopic, 0, po.FirstOffset, po.LastOffset, func(m kafka.Message) (bool, error) {
		var rec progressRecord
		if json.Unmarshal(m.Value, &rec) == nil && rec.Topic == b.cfg.Topic && rec.Group == b.cfg.Group {
			out[rec.Partition] = rec
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// bounds returns the first offset and the end of the partitions ids of
// topic; a partition the broker did not answer for has none (0, 0).
func (b *Broker) bounds(ctx context.Context, topic string, ids ...int) (map[int]kafka.PartitionOffsets, error) {
	var reqs []kafka.OffsetRequest
	for _, id := range ids {
		reqs = append(reqs, kafka.FirstOffsetOf(id), kafka.LastOffsetOf(id))
	}
	lo, err := b.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafkadlq: offsets of %q: %w", topic, err)
	}
	out := make(map[int]kafka.PartitionOffsets, len(ids))
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafkadlq: offsets of %q partition %d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po
	}
	return out, nil
}

// ensureProgressTopic creates the progress topic when it does not exist,
// waits until it has a leader, and checks that it keeps its records
// (ErrProgressNotDurable). It succeeds once per Broker.
func (b *Broker) ensureProgressTopic(ctx context.Context) error {
	if b.durable {
		return nil
	}
	topic := b.cfg.ProgressTopic
	md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("kafkadlq: metadata of the progress topic %q: %w", topic, err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		resp, err := b.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
			Topic: topic, NumPartitions: 1, ReplicationFactor: min(3, len(md.Brokers)),
			ConfigEntries: []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}},
		}}})
		if err == nil {
			err = resp.Errors[topic]
		}
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("kafkadlq: create the progress topic %q (or create it, compacted, beforehand): %w", topic, err)
		}
		if err := b.waitLeader(ctx, topic); err != nil {
			return err
		}
	}
	dc, err := b.client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"cleanup.policy", "retention.ms"},
	}}})
	if err != nil {
		return fmt.Errorf("kafkadlq: configuration of the progress topic %q: %w", topic, err)
	}
	conf := map[string]string{}
	for _, res := range dc.Resources {
		if res.Error != nil {
			return fmt.Errorf("kafkadlq: configuration of the progress topic %q: %w", topic, res.Error)
		}
		for _, e := range res.ConfigEntries {
			conf[e.ConfigName] = e.ConfigValue
		}
	}
	if conf["cleanup.policy"] != "compact" && conf["retention.ms"] != "-1" {
		return fmt.Errorf("%w: %q has cleanup.policy=%s and retention.ms=%s; want cleanup.policy=compact",
			ErrProgressNotDurable, topic, conf["cleanup.policy"], conf["retention.ms"])
	}
	b.durable = true
	return nil
}

// waitLeader waits, at most Config.Timeout, until topic's partition 0 has
// a leader.
func (b *Broker) waitLeader(ctx context.Context, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	err := brokerkit.Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		return err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && slices.ContainsFunc(md.Topics[0].Partitions,
			func(p kafka.Partition) bool { return p.ID == 0 && p.Error == nil && p.Leader.Host != "" }), err
	})
	if err != nil {
		return fmt.Errorf("kafkadlq: the progress topic %q has no leader yet: %w", topic, err)
	}
	return nil
}
