package consumertest_test

import (
	"testing"

	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
)

// TestFaultKindIsOneVocabulary checks that the kits' FaultKind is one type
// (a kind of one kit is assignable to another's without conversion), that a
// name two kits share names the same kind, and that different names name
// different kinds.
func TestFaultKindIsOneVocabulary(t *testing.T) {
	// Each kit's field takes another kit's kind as it is.
	d := consumertest.Delivery{Fault: memsource.CrashAfterCommit}.Fault
	s := memsource.Fault{Kind: d}.Kind
	k := memdedup.Fault{Kind: s}.Kind
	if k != consumertest.CrashAfterCommit {
		t.Errorf("memsource.CrashAfterCommit = %v, consumertest.CrashAfterCommit = %v", k, consumertest.CrashAfterCommit)
	}
	shared := map[string][2]consumertest.FaultKind{
		"Redelivered":         {consumertest.Redelivered, memsource.Redelivered},
		"ConcurrentDuplicate": {consumertest.ConcurrentDuplicate, memsource.ConcurrentDuplicate},
		"CrashAfterCommit":    {consumertest.CrashAfterCommit, memsource.CrashAfterCommit},
	}
	for name, p := range shared {
		if p[0] != p[1] {
			t.Errorf("consumertest.%s = %v, memsource.%s = %v", name, p[0], name, p[1])
		}
	}
	all := map[string]consumertest.FaultKind{
		"None": consumertest.None, "Redelivered": consumertest.Redelivered,
		"ConcurrentDuplicate": consumertest.ConcurrentDuplicate,
		"CrashAfterCommit":    consumertest.CrashAfterCommit,
		"ProducerDuplicate":   consumertest.ProducerDuplicate,
		"ReceiveError":        memsource.ReceiveError, "AckError": memsource.AckError,
		"RetryError": memsource.RetryError, "DeadLetterError": memsource.DeadLetterError,
		"BeginError": memdedup.BeginError, "ClaimError": memdedup.ClaimError,
		"CommitError": memdedup.CommitError, "RecordFailureError": memdedup.RecordFailureError,
	}
	seen := map[consumertest.FaultKind]string{}
	for name, k := range all {
		if prev, ok := seen[k]; ok {
			t.Errorf("%s and %s are the same kind %v", prev, name, k)
		}
		seen[k] = name
	}
}
