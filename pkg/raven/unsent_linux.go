package raven

import (
	"crypto/tls"
	"net"
	"syscall"
	"unsafe"
)

// unsent is how many bytes of what was written on conn raven's host has not acknowledged
// yet (the kernel's send queue, SIOCOUTQ): bytes that raven has not received, 0 when it
// cannot tell.
func unsent(conn net.Conn) int {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	tcp, ok := conn.(*net.TCPConn)
	if !ok {
		return 0
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return 0
	}
	var n int32
	_ = raw.Control(func(fd uintptr) {
		// SIOCOUTQ is TIOCOUTQ on Linux.
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n))); errno != 0 {
			n = 0
		}
	})
	return int(n)
}
