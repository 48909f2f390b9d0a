package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// An error shows the database name and the file path the user typed, and
// still hides the password and secret parameters.
func TestErrorsShowWhatUserTyped(t *testing.T) {
	pg, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	wrongDB := *pg
	wrongDB.User = url.UserPassword(pg.User.Username(), plantedSecret)
	wrongDB.Path = "/no_such_db_idemq"
	wrongDB.RawQuery = "sslmode=disable&sslpassword=" + plantedSecret
	missing := filepath.Join(t.TempDir(), "missing-dir", "shop.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--dsn", wrongDB.String()}, "no_such_db_idemq"},
		{[]string{"stats", "--dsn", "sqlite:" + missing}, missing},
	} {
		code, out, errOut := idemq(t, tc.args...)
		all := out + errOut
		if code == exitOK {
			t.Fatalf("idemq %s succeeded:\n%s", tc.args[0], all)
		}
		if strings.Contains(all, plantedSecret) {
			t.Fatalf("idemq %s shows the secret:\n%s", tc.args[0], all)
		}
		if !strings.Contains(all, tc.want) {
			t.Fatalf("idemq %s hides %q, which the user typed:\n%s", tc.args[0], tc.want, all)
		}
	}
}
