package proxy

import "github.com/confshim/confshim/rewrite"

// arrival scans a JSON configs body on a goroutine of its own while the body is still
// being read (rewrite.BodyScan), so that once its last byte is in only the item it
// ended in and the decision remain: a changed sync costs the client no more wall time
// than the bytes' arrival. It reads only the prefixes it is offered, which the reader
// never writes again.
type arrival struct {
	scan     *rewrite.BodyScan
	prefixes chan []byte // the latest prefix not yet scanned (a newer one replaces it)
	done     chan struct{}
}

func startArrival(rw *rewrite.Rewriter) *arrival {
	a := &arrival{scan: rw.NewBodyScan(), prefixes: make(chan []byte, 1), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for p := range a.prefixes {
			a.scan.Feed(p)
		}
	}()
	return a
}

// offer hands the scan the body read so far; it never waits for the scan.
func (a *arrival) offer(prefix []byte) {
	select {
	case a.prefixes <- prefix:
	default: // the scan is busy with an older one: this one replaces it
		select {
		case <-a.prefixes:
		default:
		}
		a.prefixes <- prefix // the only sender: there is room now
	}
}

// end stops the scan where it stands and waits for its goroutine, after which the
// body's buffer is the caller's alone; the scan's result goes to PrepareArrived.
func (a *arrival) end() *rewrite.BodyScan {
	a.scan.Stop()
	close(a.prefixes)
	<-a.done
	return a.scan
}
