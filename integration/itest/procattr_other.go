//go:build !linux

package itest

import "syscall"

func dieWithParent() *syscall.SysProcAttr { return nil }
