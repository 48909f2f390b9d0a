//go:build !linux

package main

import "syscall"

// childAttr returns nil: only Linux can tie a child's life to its parent's.
func childAttr() *syscall.SysProcAttr { return nil }
