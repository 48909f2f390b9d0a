package deduptest_test

import (
	"database/sql"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/runtest"
)

// storeColumn is one store of the capability table in dedup/doc.go: its
// column heading, its type, the directory of its package (from the
// repository root) and the type's name there.
type storeColumn struct {
	heading  string
	typ      reflect.Type
	dir      string
	typeName string
}

var storeColumns = []storeColumn{
	{"pgdedup", reflect.TypeFor[*pgdedup.Store](), "dedup/pgdedup", "Store"},
	{"sqldedup", reflect.TypeFor[*sqldedup.Store](), "dedup/sqldedup", "Store"},
	{"redisdedup", reflect.TypeFor[*redisdedup.Store](), "dedup/redisdedup", "Store"},
	{"memdedup.Store", reflect.TypeFor[*memdedup.Store](), "dedup/memdedup", "Store"},
	{"memdedup.Leases", reflect.TypeFor[*memdedup.Leases](), "dedup/memdedup", "Leases"},
}

// ifaceTypes returns the interface of dedup named name, instantiated with
// each store's transaction type when it is generic (nil for a store without
// one): a generic interface is implemented when a store implements it for
// its own Tx.
func ifaceTypes(name string) map[string]reflect.Type {
	generic := func(pg, sq, mem reflect.Type) map[string]reflect.Type {
		return map[string]reflect.Type{"pgdedup": pg, "sqldedup": sq, "memdedup.Store": mem}
	}
	same := func(t reflect.Type) map[string]reflect.Type {
		m := map[string]reflect.Type{}
		for _, c := range storeColumns {
			m[c.heading] = t
		}
		return m
	}
	switch name {
	case "TxStore":
		return generic(reflect.TypeFor[dedup.TxStore[pgx.Tx]](), reflect.TypeFor[dedup.TxStore[*sql.Tx]](), reflect.TypeFor[dedup.TxStore[*memdedup.Tx]]())
	case "BeginClaimer":
		return generic(reflect.TypeFor[dedup.BeginClaimer[pgx.Tx]](), reflect.TypeFor[dedup.BeginClaimer[*sql.Tx]](), reflect.TypeFor[dedup.BeginClaimer[*memdedup.Tx]]())
	case "CommitChainer":
		return generic(reflect.TypeFor[dedup.CommitChainer[pgx.Tx]](), reflect.TypeFor[dedup.CommitChainer[*sql.Tx]](), reflect.TypeFor[dedup.CommitChainer[*memdedup.Tx]]())
	case "FailedTxReporter":
		return generic(reflect.TypeFor[dedup.FailedTxReporter[pgx.Tx]](), reflect.TypeFor[dedup.FailedTxReporter[*sql.Tx]](), reflect.TypeFor[dedup.FailedTxReporter[*memdedup.Tx]]())
	case "EndedTxReporter":
		return generic(reflect.TypeFor[dedup.EndedTxReporter[pgx.Tx]](), reflect.TypeFor[dedup.EndedTxReporter[*sql.Tx]](), reflect.TypeFor[dedup.EndedTxReporter[*memdedup.Tx]]())
	case "ResultStorer":
		return generic(reflect.TypeFor[dedup.ResultStorer[pgx.Tx]](), reflect.TypeFor[dedup.ResultStorer[*sql.Tx]](), reflect.TypeFor[dedup.ResultStorer[*memdedup.Tx]]())
	case "ResultCompleter":
		return same(reflect.TypeFor[dedup.ResultCompleter]())
	case "LeaseStore":
		return same(reflect.TypeFor[dedup.LeaseStore]())
	case "AbortClassifier":
		return same(reflect.TypeFor[dedup.AbortClassifier]())
	case "TransientClassifier":
		return same(reflect.TypeFor[dedup.TransientClassifier]())
	case "BatchClaimer":
		return same(reflect.TypeFor[dedup.BatchClaimer]())
	case "FailureCounter":
		return same(reflect.TypeFor[dedup.FailureCounter]())
	case "PoolSizer":
		return same(reflect.TypeFor[dedup.PoolSizer]())
	case "RetentionReporter":
		return same(reflect.TypeFor[dedup.RetentionReporter]())
	case "TableStatsReporter":
		return same(reflect.TypeFor[dedup.TableStatsReporter]())
	case "SchemaChecker":
		return same(reflect.TypeFor[dedup.SchemaChecker]())
	case "DurabilityReporter":
		return same(reflect.TypeFor[dedup.DurabilityReporter]())
	}
	return nil
}

// repoRoot is the repository root, two directories up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// docTable parses the capability table of dedup/doc.go: the indented block
// whose first row starts with "interface". It returns the column headings
// after the first and, per interface, the cells in that order.
func docTable(t *testing.T) (headings []string, rows map[string][]string, order []string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "dedup", "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	rows = map[string][]string{}
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		cells := strings.Fields(strings.TrimPrefix(line, "//"))
		if !in {
			if strings.HasPrefix(line, "//\t") && len(cells) > 1 && cells[0] == "interface" {
				headings, in = cells[1:], true
			}
			continue
		}
		if !strings.HasPrefix(line, "//\t") || len(cells) == 0 {
			break
		}
		if len(cells) != len(headings)+1 {
			t.Fatalf("dedup/doc.go: table row %q has %d cells, want %d", line, len(cells), len(headings)+1)
		}
		rows[cells[0]] = cells[1:]
		order = append(order, cells[0])
	}
	if headings == nil {
		t.Fatal(`dedup/doc.go: no capability table (an indented block starting with "interface")`)
	}
	return headings, rows, order
}

// assertions returns, per type name of the package in dir, the dedup
// interfaces named in the `var _ dedup.X = (*T)(nil)` declarations (generic
// arguments dropped) of its capabilities.go, where a store package keeps
// them all so that a reader finds them in one place.
func assertions(t *testing.T, dir string) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(repoRoot(t), dir, "capabilities.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "_" || vs.Type == nil || len(vs.Values) != 1 {
			return true
		}
		typ := vs.Type
		switch x := typ.(type) {
		case *ast.IndexExpr:
			typ = x.X
		case *ast.IndexListExpr:
			typ = x.X
		}
		sel, ok := typ.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "dedup" {
			return true
		}
		// The value is (*T)(nil).
		call, ok := vs.Values[0].(*ast.CallExpr)
		if !ok {
			return true
		}
		paren, ok := call.Fun.(*ast.ParenExpr)
		if !ok {
			return true
		}
		star, ok := paren.X.(*ast.StarExpr)
		if !ok {
			return true
		}
		if id, ok := star.X.(*ast.Ident); ok {
			out[id.Name] = append(out[id.Name], sel.Sel.Name)
		}
		return true
	})
	return out
}

// The table in dedup/doc.go of which store implements which interface, the
// stores' method sets and their compile-time assertions say the same thing,
// and the table names every interface of package dedup.
func TestCapabilityTableMatchesStores(t *testing.T) {
	headings, rows, order := docTable(t)
	var want []string
	for _, c := range storeColumns {
		want = append(want, c.heading)
	}
	if !slices.Equal(headings, want) {
		t.Fatalf("dedup/doc.go: table columns %q, want %q", headings, want)
	}

	// Every interface that package dedup declares has a row.
	declared := runtest.ExportedInterfaces(t, filepath.Join(repoRoot(t), "dedup"))
	listed := slices.Sorted(slices.Values(order))
	if !slices.Equal(declared, listed) {
		t.Errorf("dedup/doc.go: table rows %q, want one per interface of package dedup %q", listed, declared)
	}

	asserted := map[string]map[string][]string{}
	for _, c := range storeColumns {
		if asserted[c.dir] == nil {
			asserted[c.dir] = assertions(t, c.dir)
		}
	}
	for _, name := range order {
		types := ifaceTypes(name)
		if types == nil {
			t.Errorf("dedup/doc.go: row %s: the test does not know this interface; add it to ifaceTypes", name)
			continue
		}
		for i, c := range storeColumns {
			cell := rows[name][i]
			if cell != "x" && cell != "." {
				t.Errorf("dedup/doc.go: row %s, column %s: %q, want x or .", name, c.heading, cell)
				continue
			}
			inTable := cell == "x"
			iface := types[c.heading]
			implements := iface != nil && c.typ.Implements(iface)
			if inTable != implements {
				t.Errorf("dedup/doc.go: row %s, column %s says %v, but %v implements it: %v", name, c.heading, inTable, c.typ, implements)
			}
			hasAssertion := slices.Contains(asserted[c.dir][c.typeName], name)
			if implements && !hasAssertion {
				t.Errorf("%s/capabilities.go: no `var _ dedup.%s = (*%s)(nil)`", c.dir, name, c.typeName)
			}
		}
	}
}
