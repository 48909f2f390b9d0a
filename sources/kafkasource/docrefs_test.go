package kafkasource_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
)

// TestDocNamesRealConsumerFields: the documentation of the sources tells
// users which consumer.Config fields to set; each one it names must exist
// (doc.go once named a consumer.Config.KeyOf that never did).
func TestDocNamesRealConsumerFields(t *testing.T) {
	files, err := filepath.Glob("../*/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no source files: %v", err)
	}
	ref := regexp.MustCompile(`consumer\.(Config|RetryPolicy)\.([A-Za-z_]\w*)`)
	types := map[string]reflect.Type{
		"Config":      reflect.TypeOf(consumer.Config{}),
		"RetryPolicy": reflect.TypeOf(consumer.RetryPolicy{}),
	}
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ref.FindAllStringSubmatch(string(b), -1) {
			seen++
			typ := types[m[1]]
			if _, ok := typ.FieldByName(m[2]); !ok {
				if _, ok := reflect.PointerTo(typ).MethodByName(m[2]); !ok {
					t.Errorf("%s names %s, which %s does not have", f, m[0], typ)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no reference to consumer.Config found; the pattern is wrong")
	}
}
