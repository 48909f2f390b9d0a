package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
)

func (p *txPath[Tx]) describe() (string, string) {
	if p.bh != nil {
		return "transactional-batch", typeName(p.store)
	}
	return "transactional", typeName(p.store)
}

func (p *leasePath) describe() (string, string) { return "lease", typeName(p.store) }

// logStart logs at Info what a runner with cfg consumes (the source's
// String, else its type), through which path and store, and with which key
// function. log names the consumer already.
func logStart(ctx context.Context, log *slog.Logger, cfg Config, source Source, path Path) {
	kind, store := path.describe()
	src := typeName(source)
	if s, ok := source.(fmt.Stringer); ok {
		src = s.String()
	}
	log.LogAttrs(ctx, slog.LevelInfo, "consuming",
		slog.String("source", src),
		slog.String("path", kind),
		slog.String("store", store),
		slog.String("key", funcName(cfg.KeyFunc)),
		slog.Int("concurrency", cfg.Concurrency),
		slog.Int("batch_size", cfg.BatchSize))
}

// typeName is v's dynamic type, like "*pgdedup.Store".
func typeName(v any) string {
	if v == nil {
		return "<nil>"
	}
	return reflect.TypeOf(v).String()
}

// funcName is the name of a function value without its module path, like
// "consumer.DefaultKey"; closures are named after their enclosing function.
func funcName(f any) string {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Func || v.IsNil() {
		return "<nil>"
	}
	fn := runtime.FuncForPC(v.Pointer())
	if fn == nil {
		return "<unknown>"
	}
	name := fn.Name()
	return name[strings.LastIndex(name, "/")+1:]
}
