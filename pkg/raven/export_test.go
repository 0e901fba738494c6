package raven

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
)

// TrustForTest makes c trust the roots (a test server's certificate).
func TrustForTest(c *Client, roots *x509.CertPool) {
	c.http.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}
