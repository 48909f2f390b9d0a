package migrate

import (
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// load reads the migrations in dir of fsys, in version order, as they are
// written. Each file name starts with its version and each file has an
// "-- +goose Up" and an "-- +goose Down" section.
func load(fsys fs.FS, dir string) ([]Migration, error) {
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
