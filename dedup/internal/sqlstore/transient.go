package sqlstore

import (
	"errors"
	"io"
	"net"
	"strings"
)

// PostgresTransient reports whether a PostgreSQL SQLSTATE names a condition
// that says nothing about the statement's data: serialization failures and
// deadlocks (40001, 40P01), lock timeouts (55P03), lost or refused
// connections (class 08), a server that is shutting down or starting
// (57P01-57P03) and exhausted resources (class 53).
func PostgresTransient(code string) bool {
	switch code {
	case "40001", "40P01", "55P03", "57P01", "57P02", "57P03":
		return true
	}
	return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "53")
}

// NetworkTransient reports whether err comes from the network between the
// process and its database: a connection refused, reset or timed out, or
// closed in the middle of a reply.
func NetworkTransient(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
