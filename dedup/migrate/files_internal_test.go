package migrate

import (
	"testing"
	"testing/fstest"
)

func TestLoadOrdersAndSplits(t *testing.T) {
	fsys := fstest.MapFS{
		"m/002_b.sql": {Data: []byte("-- +goose Up\nB UP;\n-- +goose Down\nB DOWN;\n")},
		"m/001_a.sql": {Data: []byte("-- header\n-- +goose Up\nA UP;\n-- +goose Down\nA DOWN;\n")},
	}
	ms, err := load(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[0].Up != "A UP;" || ms[0].Down != "A DOWN;" || ms[1].Name != "002_b.sql" {
		t.Fatalf("load = %+v", ms)
	}
	for name, data := range map[string]string{"m/x_bad.sql": "-- +goose Up\n-- +goose Down\n", "m/003_c.sql": "no sections"} {
		bad := fstest.MapFS{name: {Data: []byte(data)}}
		if _, err := load(bad, "m"); err == nil {
			t.Errorf("load accepted %s", name)
		}
	}
}
