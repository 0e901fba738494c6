//go:build unix

package natsnode_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/natsnode"
)

// A second server on a store directory in use is refused, naming the process that holds
// it, and the first keeps running; once the first is shut down, the directory can be
// used again. (Two standalone dispatchers on one DATA_DIR both started, wrote one store
// and each sent the same request to raven.) A restart in place keeps the directory.
func TestAStoreDirectoryTakesOneServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	_, err = natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "in use by another server of this process (pid "+fmt.Sprint(os.Getpid())+")") {
		first.Shutdown()
		t.Fatalf("a second server on the same store directory: %v; want it refused, naming this process", err)
	}
	if err := first.Restart(); err != nil {
		t.Fatalf("the first server's restart in place: %v", err)
	}
	if !first.Server().JetStreamEnabled() {
		t.Fatal("the first server runs without JetStream after the second was refused")
	}
	// The restart kept the directory: no other server got in between.
	if _, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir}, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "in use") {
		first.Shutdown()
		t.Fatalf("a second server after the first's restart: %v; want it refused", err)
	}
	first.Shutdown()
	again, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir}, zerolog.Nop())
	if err != nil {
		t.Fatalf("a server on the directory once the first was shut down: %v", err)
	}
	// A server shut down by itself, not through its node, lets the directory go too, a
	// moment after (its node hears of it).
	again.Server().Shutdown()
	again.Server().WaitForShutdown()
	var third *natsnode.Node
	for deadline := time.Now().Add(30 * time.Second); third == nil; time.Sleep(10 * time.Millisecond) {
		if third, err = natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir}, zerolog.Nop()); err != nil && time.Now().After(deadline) {
			t.Fatalf("a server on the directory once the one before was shut down directly: %v", err)
		}
	}
	third.Shutdown()
}
