// Package layering holds the test that keeps the repository's layers apart:
// the core (consumer, dedup and its stores) imports no broker SDK and no
// adapter, test environments stay in tests, and examples and commands are
// leaves that nothing imports. It has no code of its own.
package layering
