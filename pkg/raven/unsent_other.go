//go:build !linux

package raven

import "net"

// unsent is 0 where the kernel's send queue cannot be asked: an answer before the whole
// request is then told only by the body net/http had not taken yet.
func unsent(net.Conn) int { return 0 }
