package sqlstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
)

// postgresMigrations reads dedup/migrate's PostgreSQL files of the
// processed-message table, in version order.
func postgresMigrations() ([]string, error) {
	names, err := filepath.Glob("../../migrate/sql/dedup/postgres/*.sql")
	var ms []string
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, string(b))
	}
	return ms, err
}

func TestPostgresMigrationsRender(t *testing.T) {
	ms, err := postgresMigrations()
	if err != nil || len(ms) == 0 {
		t.Fatalf("Postgres() = %v, %v", ms, err)
	}
	got := Render(ms[0], `"s"."seen"`, "seen", func(n string) string { return `"` + n + `"` })
	if strings.Contains(got, DefaultTable) || !strings.Contains(got, `"s"."seen"`) || !strings.Contains(got, `"seen_expires_at_idx"`) {
		t.Fatalf("rendered:\n%s", got)
	}
}

func TestFailureTableRendersInTheSchema(t *testing.T) {
	ms, err := postgresMigrations()
	if err != nil || len(ms) < 2 {
		t.Fatalf("Postgres() = %v, %v", ms, err)
	}
	got := Render(ms[1], `"s"."seen"`, "seen", func(n string) string { return `"` + n + `"` })
	if strings.Contains(got, DefaultTable) || !strings.Contains(got, `TABLE IF NOT EXISTS "s"."seen_failures"`) ||
		!strings.Contains(got, `ON "s"."seen_failures"`) || !strings.Contains(got, `INDEX IF NOT EXISTS "seen_failures_expires_at_idx"`) {
		t.Fatalf("rendered:\n%s", got)
	}
}

func TestCleanupStopsOnShortBatchBusyOrError(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		steps []int64 // deleted per call; -1 busy, -2 error
		want  int64
		err   error
	}{
		{"drains full batches", []int64{10, 10, 3}, 23, nil},
		{"stops when busy", []int64{10, -1}, 10, nil},
		{"stops on error", []int64{10, -2}, 10, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			n, err := cleanupPaced(context.Background(), 10, 0, func(context.Context) (int64, bool, error) {
				s := tc.steps[i]
				i++
				switch s {
				case -1:
					return 0, true, nil
				case -2:
					return 0, false, boom
				}
				return s, false, nil
			})
			if n != tc.want || !errors.Is(err, tc.err) || i != len(tc.steps) {
				t.Fatalf("cleanupPaced = %d, %v after %d calls; want %d, %v after %d", n, err, i, tc.want, tc.err, len(tc.steps))
			}
		})
	}
}

func TestCleanupPacedPausesBetweenFullBatches(t *testing.T) {
	// The pause is far longer than ctx: Cleanup returns in the first one.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	calls := 0
	n, err := cleanupPaced(ctx, 10, time.Hour, func(context.Context) (int64, bool, error) {
		calls++
		return 10, false, nil
	})
	if n != 10 || !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Fatalf("cleanupPaced = %d, %v after %d calls; want 10, %v after 1", n, err, calls, context.DeadlineExceeded)
	}
	// No pause after a batch that was not full: the cleanup is over.
	calls = 0
	n, err = cleanupPaced(context.Background(), 10, time.Hour, func(context.Context) (int64, bool, error) {
		calls++
		return 3, false, nil
	})
	if n != 3 || err != nil || calls != 1 {
		t.Fatalf("cleanupPaced = %d, %v after %d calls; want 3, nil after 1", n, err, calls)
	}
}

func TestTransientClassification(t *testing.T) {
	for code, want := range map[string]bool{
		"40001": true, "40P01": true, "08006": true, "08001": true, "57P01": true, "57P02": true, "57P03": true,
		"25P03": true, "08003": true,
		"55P03": false, "53300": false, "53100": false, "23505": false, "22021": false, "25P02": false, "42601": false,
	} {
		if got := PostgresTransient(code); got != want {
			t.Errorf("PostgresTransient(%s) = %v, want %v", code, got, want)
		}
	}
	if !PostgresAborted("25P02") || PostgresAborted("40001") {
		t.Error("PostgresAborted misclassifies")
	}
}

// TestJanitorLogsCarryItsContext checks that the janitor logs with the
// context it runs with, so that a trace-aware handler sees its values.
func TestJanitorLogsCarryItsContext(t *testing.T) {
	rec := testenv.NewLogRecorder()
	ctx, cancel := context.WithCancel(testenv.MarkedContext(t.Context(), "janitor"))
	calls := 0
	cleanup := func(context.Context) (int64, error) {
		calls++
		if calls == 1 {
			return 3, nil
		}
		cancel()
		return 0, errors.New("store gone")
	}
	if err := New("test", nil, Settings{Table: "t"}).RunJanitor(ctx, time.Millisecond, -1, rec.Logger(), cleanup); err != nil {
		t.Fatal(err)
	}
	lines := rec.Find("test: expired records deleted")
	if len(lines) != 1 || lines[0].Mark != "janitor" {
		t.Fatalf("deletion lines %+v, want one logged with the janitor's context", lines)
	}
}
