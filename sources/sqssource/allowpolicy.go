package sqssource

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Values of RedriveAllowPolicy.Permission.
const (
	RedrivePermissionAllowAll = "allowAll"
	RedrivePermissionDenyAll  = "denyAll"
	RedrivePermissionByQueue  = "byQueue"
)

// RedriveAllowPolicy is a queue's RedriveAllowPolicy attribute: which queues
// may use it as their dead-letter queue. SQS enforces it on redrive
// policies, New enforces it on Config.DeadLetterQueueURL, and sqsdlq relies
// on it to move a whole dead-letter queue to its one source.
type RedriveAllowPolicy struct {
	// Permission is RedrivePermissionAllowAll (also when the attribute is
	// absent), RedrivePermissionDenyAll or RedrivePermissionByQueue.
	Permission string `json:"redrivePermission"`
	// SourceQueueARNs are the queues allowed by RedrivePermissionByQueue.
	SourceQueueARNs []string `json:"sourceQueueArns,omitempty"`
}

// ParseRedriveAllowPolicy reads a RedriveAllowPolicy attribute; "" is
// RedrivePermissionAllowAll, SQS's default.
func ParseRedriveAllowPolicy(attr string) (RedriveAllowPolicy, error) {
	if attr == "" {
		return RedriveAllowPolicy{Permission: RedrivePermissionAllowAll}, nil
	}
	var p RedriveAllowPolicy
	if err := json.Unmarshal([]byte(attr), &p); err != nil {
		return p, fmt.Errorf("parse redrive allow policy %q: %w", attr, err)
	}
	switch p.Permission {
	case RedrivePermissionAllowAll, RedrivePermissionDenyAll, RedrivePermissionByQueue:
		return p, nil
	}
	return p, fmt.Errorf("redrive allow policy %q: unknown redrivePermission %q", attr, p.Permission)
}

// Allows reports whether the queue sourceARN may use the policy's queue as
// its dead-letter queue.
func (p RedriveAllowPolicy) Allows(sourceARN string) bool {
	switch p.Permission {
	case RedrivePermissionAllowAll:
		return true
	case RedrivePermissionByQueue:
		return slices.Contains(p.SourceQueueARNs, sourceARN)
	}
	return false
}
