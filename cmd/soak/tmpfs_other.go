//go:build !linux

package main

import "errors"

func canMount() bool { return false }

func mountTmpfs(string, int) error { return errors.New("mounting a tmpfs needs Linux") }

func unmount(string) {}
