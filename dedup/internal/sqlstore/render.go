package sqlstore

import (
	"regexp"
	"strings"
)

// DefaultTable is the table name the migration files of dedup/migrate are
// written for.
const DefaultTable = "processed_messages"

// defaultNameRE matches DefaultTable and the names derived from it.
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
