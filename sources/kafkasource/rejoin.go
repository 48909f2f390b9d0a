package kafkasource

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// leavingFormat is the line kafka-go's ConsumerGroup logs, with the group
// and the member id, before it leaves the group with a member and forgets
// that member: after any failure to join, sync or reach the coordinator, it
// then rejoins as a new member. While the broker is away (a restart), its
// LeaveGroup fails too, and the restarted coordinator, which reloads the
// group with the old member, completes the new member's join only once the
// old one left or its session expired: SessionTimeout after the reload.
const leavingFormat = "Leaving group %s, member %s"

// abandonedMembers is how many members kafka-go gave up that wait for the
// source's LeaveGroup; more are left to their session timeout.
const abandonedMembers = 8

// leaveTimeout bounds one LeaveGroup attempt of the source, and
// leaveInterval is the pause between two: a LeaveGroup is due as soon as
// the coordinator answers, and the group waits for it.
const (
	leaveTimeout  = 5 * time.Second
	leaveInterval = 100 * time.Millisecond
)

// leaveAbandoned leaves the group with each member kafka-go gave up (see
// leavingFormat), until ctx is cancelled (Close).
func (s *Source) leaveAbandoned(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case member := <-s.stats.abandoned:
			s.leave(ctx, member)
		}
	}
}

// leave sends LeaveGroup for member until the coordinator says that it does
// not know the member: it left (by this LeaveGroup or kafka-go's own), or
// its session expired. A success is not the end: a coordinator still
// loading the group after a restart answered one without removing the
// member, which it then loaded. It tries again every leaveInterval while
// the broker is unreachable or the coordinator not ready, and gives up
// SessionTimeout + RebalanceTimeout after the broker first answered, when
// the coordinator has dropped the member by itself.
func (s *Source) leave(ctx context.Context, member string) {
	var answered time.Time // the first answer of the broker
	left := false          // a LeaveGroup succeeded
	for {
		lctx, cancel := context.WithTimeout(ctx, leaveTimeout)
		res, err := s.client.LeaveGroup(lctx, &kafka.LeaveGroupRequest{
			GroupID: s.cfg.GroupID,
			Members: []kafka.LeaveGroupRequestMember{{ID: member}},
		})
		cancel()
		if err == nil {
			err = res.Error
		}
		if err == nil && len(res.Members) > 0 {
			err = res.Members[0].Error
		}
		var kerr kafka.Error
		if answered.IsZero() && (err == nil || errors.As(err, &kerr)) {
			answered = time.Now()
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			left = true
		case errors.Is(err, kafka.UnknownMemberId):
			if left {
				s.stats.membersLeft.Add(1)
				s.log.InfoContext(ctx, "left the consumer group with the member kafka-go gave up while the broker was away, so that the group rebalances without waiting for its session to expire",
					logKeyMember, member)
			}
			return
		case errors.As(err, &kerr) && !kerr.Temporary():
			s.log.WarnContext(ctx, "could not leave the consumer group with the member kafka-go gave up; the group rebalances once its session expires",
				logKeyMember, member, consumer.LogKeyError, err)
			return
		}
		if !answered.IsZero() && time.Since(answered) > s.cfg.SessionTimeout+s.cfg.RebalanceTimeout {
			return
		}
		brokerkit.Sleep(ctx.Done(), leaveInterval)
	}
}
