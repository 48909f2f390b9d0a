package faults

import (
	"strings"
	"testing"
)

func TestScriptFiresInOrderAndCounts(t *testing.T) {
	var s Script[string]
	s.Add("a", 2)
	s.Add("b", 0)  // once
	s.Add("c", -1) // until Clear
	all := func(string) bool { return true }
	var got []string
	for range 6 {
		f, ok := s.Fire(all)
		if !ok {
			t.Fatalf("no fault after %q", got)
		}
		got = append(got, f)
	}
	if want := "a a b c c c"; join(got) != want {
		t.Fatalf("fired %q, want %q", join(got), want)
	}
	if f, ok := s.Fire(func(f string) bool { return f != "c" }); ok {
		t.Fatalf("fired %q after a and b were used up", f)
	}
	s.Clear()
	if f, ok := s.Fire(all); ok {
		t.Fatalf("fired %q after Clear", f)
	}
}

func TestScriptSkipsWhatDoesNotMatch(t *testing.T) {
	var s Script[int]
	s.Add(1, 1)
	s.Add(2, 1)
	if f, ok := s.Fire(func(f int) bool { return f == 2 }); !ok || f != 2 {
		t.Fatalf("Fire = %d, %v; want 2", f, ok)
	}
	if f, ok := s.Fire(func(int) bool { return true }); !ok || f != 1 {
		t.Fatalf("Fire = %d, %v; want 1, left in place", f, ok)
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

func TestKindNames(t *testing.T) {
	seen := map[string]Kind{}
	for k := None; k <= RecordFailureError; k++ {
		name := k.String()
		if name == "" || strings.HasPrefix(name, "faults.Kind(") {
			t.Errorf("Kind(%d) has no name: %q", int(k), name)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("%v and Kind(%d) share the name %q", prev, int(k), name)
		}
		seen[name] = k
	}
	if got := Kind(99).String(); got != "faults.Kind(99)" {
		t.Errorf("Kind(99).String() = %q", got)
	}
}
