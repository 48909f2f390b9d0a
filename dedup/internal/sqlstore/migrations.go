// Package sqlstore is the machinery shared by the SQL stores, dedup/pgdedup
// and dedup/sqldedup, and by dedup/migrate: reading and rendering migration
// files, the claim algorithm, the configuration they share, and Store, the
// statements of both stores that do not depend on the driver (failure
// counts, cleanup and the janitor, the table's measurements and report, the
// schema check) over a driver-neutral DB.
package sqlstore

import (
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// DefaultTable is the table name the migration files are written for.
const DefaultTable = "processed_messages"

// Migration is one numbered schema change, from a file with goose
// annotations.
type Migration struct {
	// Version orders migrations; it is the number the file name starts with.
	Version int
	// Name is the file name.
	Name string
	// Up is the SQL that applies the migration, for DefaultTable.
	Up string
	// Down is the SQL that reverts it, for DefaultTable.
	Down string
}

// Load reads the migrations in dir of fsys, in version order. Each file name
// starts with its version and each file has an "-- +goose Up" and an
// "-- +goose Down" section.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	names, err := fs.Glob(fsys, dir+"/*.sql")
	if err != nil {
		return nil, err
	}
	ms := make([]Migration, 0, len(names))
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		base := strings.TrimPrefix(name, dir+"/")
		num, _, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration %s: file name must start with its version: %w", base, err)
		}
		up, down, ok := strings.Cut(string(b), "-- +goose Down")
		if !ok {
			return nil, fmt.Errorf("migration %s has no -- +goose Down section", base)
		}
		_, up, _ = strings.Cut(up, "-- +goose Up")
		ms = append(ms, Migration{Version: v, Name: base, Up: strings.TrimSpace(up), Down: strings.TrimSpace(down)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

var defaultNameRE = regexp.MustCompile(`\b` + DefaultTable + `(_[a-z_]+)?\b`)

// Render rewrites SQL written for DefaultTable: the table becomes
// qualifiedTable (quoted, possibly schema-qualified), the failure table
// (DefaultTable + FailuresSuffix) becomes quote(table + FailuresSuffix) in the
// same schema, and any other name derived from it, such as an index name,
// becomes quote(table + suffix). Names must have been validated as
// identifiers.
func Render(sql, qualifiedTable, table string, quote func(string) string) string {
	return defaultNameRE.ReplaceAllStringFunc(sql, func(m string) string {
		switch suffix := strings.TrimPrefix(m, DefaultTable); suffix {
		case "":
			return qualifiedTable
		case FailuresSuffix:
			schema := strings.TrimSuffix(qualifiedTable, quote(table))
			return schema + quote(table+suffix)
		default:
			return quote(table + suffix)
		}
	})
}

// Pending returns the migrations of ms whose versions are not in applied,
// in the order of ms.
func Pending(ms []Migration, applied []int) []Migration {
	var out []Migration
	for _, m := range ms {
		if !slices.Contains(applied, m.Version) {
			out = append(out, m)
		}
	}
	return out
}
