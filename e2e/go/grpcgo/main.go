// crisp-grpcgo: real grpc-go peers for crisp's end-to-end tests.
//
// kubelet, crictl and containerd are all grpc-go programs; the Rust test clients (tonic, hyper,
// h2) behave differently on the wire (`:authority`, BDP PINGs, HPACK indexing, PING policing).
// This binary puts grpc-go's own transport into the test paths. It is built offline from
// Debian's golang-google-grpc-dev (grpc-go 1.33) in GOPATH mode by hack/build-grpcgo.sh.
//
//	crisp-grpcgo bridge --listen SOCK --target TARGET [--authority A] [--server-keepalive-policy default|permissive]
//	crisp-grpcgo call --target TARGET --method /pkg.Service/Method [--hex HEX] [--authority A]
//	                  [--timeout 10s] [--count N] [--concurrency C] [--each] [--errors]
//	                  [--interval D] [--duration D] [--warmup N] [--latencies]
//	crisp-grpcgo headers --listen SOCK
//	crisp-grpcgo bench --lane NAME=TARGET... --method M [--hex HEX] [--authority A] [--count N]
//	                   [--warmup N] [--runs R] [--concurrency C --seconds S]
//	                   [--also M=HEX]... [--pace D] [--watch NAME=PID]...
//
// bridge: a grpc-go server on SOCK accepting every method; each call is forwarded, message
// bytes untouched, over one shared grpc-go client connection dialed the way kubelet 1.20-1.27
// dials its CRI endpoint (the bare socket path as target). Deadline, cancellation, metadata,
// response headers, trailers and the status travel through. Prints `ready` on stdout once
// listening; on SIGUSR1 prints a JSON line of HTTP/2 frame counters on stdout; on SIGTERM
// prints them to stderr and exits.
//
// call: unary calls with a kubelet-style client; prints a JSON line per call (--each, or when
// --count is 1; --errors: per failed call) and a summary line; exits 1 when any call failed.
// --interval paces each worker (one call started per interval, as a ticker; a late call starts
// at once), --duration keeps calling until it has passed (instead of --count calls), --warmup
// makes N calls first that are not measured, --latencies puts every measured call's latency
// (µs, in completion order) into the summary.
//
// bench: the same call on several targets ("lanes": direct, socat, crisp...), one kubelet-style
// connection per lane, interleaved call by call (lane order rotating with each call), so that the
// machine's load falls on every lane alike. Prints one JSON line per run with every lane's
// p50/p99/max in µs. With --concurrency > 1, each run gives each lane (in turn) --seconds of
// that many concurrent callers on its connection and reports calls/s per lane instead.
// --also adds calls made right after --method in the same turn of a lane, on its connection
// (a relist: ListPodSandbox, then ListContainers), each method's figures under "methods" and
// the turn's under "turn"; --pace pauses that long after every lane's turn (kubelet relists at
// 1 Hz; a bench wants more samples, but not a client that never lets the machine settle).
// --watch samples /proc/PID of the process serving lane NAME (and its children: socat forks
// one per connection) once its connection is warm and again after the measured calls: CPU
// ticks (/proc/PID/stat utime+stime, the whole process),
// context switches (voluntary and not, summed over /proc/PID/task/*/status: the threads alive
// at both samples, which include the lane's relay thread), VmRSS at both and VmHWM.
//
// headers: a bare HTTP/2 server that prints each request's decoded header list (and every
// PING it receives) as JSON lines and answers every call with an empty message and status OK;
// shows what a grpc-go client puts on the wire.
//
// GOAWAY frames seen on any connection are logged to stderr. grpc-go's own log goes to stderr
// at warning level unless GRPC_GO_LOG_SEVERITY_LEVEL is set.
package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/ioutil"
	"math"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// kubelet's remote.maxMsgSize.
const maxMsgSize = 16 << 20

// A forwarded call unanswered this long is logged with its connection's last frames.
const slowCall = 10 * time.Second

// How the bridge forwards calls: "invoke" (unary calls as kubelet makes them) or "stream" (the
// old forwarder: every call through NewStream + Header(), which can hang; see handle).
var forwardMode = "invoke"

// The bridge's trap, if any (the kill matrix).
var activeTrap *trap

type trapQueuedKey struct{}

// The payload of grpc-go's BDP estimator PING (internal/transport/bdp_estimator.go).
var bdpPingData = [8]byte{2, 4, 16, 16, 9, 14, 7, 7}

func main() {
	if os.Getenv("GRPC_GO_LOG_SEVERITY_LEVEL") == "" {
		grpclog.SetLoggerV2(grpclog.NewLoggerV2(ioutil.Discard, os.Stderr, os.Stderr))
	}
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "bridge":
		err = runBridge(os.Args[2:])
	case "call":
		err = runCall(os.Args[2:])
	case "headers":
		err = runHeaders(os.Args[2:])
	case "bench":
		err = runBench(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "crisp-grpcgo: unknown subcommand %q\n", os.Args[1])
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "crisp-grpcgo %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  crisp-grpcgo bridge --listen SOCK --target TARGET [--authority A] [--server-keepalive-policy default|permissive]
  crisp-grpcgo call --target TARGET --method /pkg.Service/Method [--hex HEX | request hex on stdin]
                    [--authority A] [--timeout 10s] [--count N] [--concurrency C] [--each]
                    [--errors] [--interval D] [--duration D] [--warmup N] [--latencies]
                    [--md key=value]... [--stream]
  crisp-grpcgo headers --listen SOCK
  crisp-grpcgo bench --lane NAME=TARGET... --method M [--hex HEX] [--authority A] [--count N]
                     [--warmup N] [--runs R] [--concurrency C --seconds S]
                     [--also M=HEX]... [--pace D] [--watch NAME=PID]...
`)
	os.Exit(2)
}

// ---------------------------------------------------------------------------------------------
// Raw-bytes codec: messages are already protobuf-encoded by the Rust side.

type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	switch m := v.(type) {
	case []byte:
		return m, nil
	case *[]byte:
		return *m, nil
	default:
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*p = append([]byte(nil), data...)
	return nil
}

// Name keeps the content-type `application/grpc`: with ForceCodec the content-subtype stays
// empty, as for kubelet's proto codec.
func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

// ---------------------------------------------------------------------------------------------
// HTTP/2 frame counters: every connection is wrapped so its frame headers are parsed as they
// pass, in both directions. Payloads are only kept for PING, GOAWAY and RST_STREAM.

type wireStats struct {
	Conns      int64 `json:"conns"`
	Headers    int64 `json:"headers_sent"`
	HeadersIn  int64 `json:"headers_recv"`
	Data       int64 `json:"data_sent"`
	DataIn     int64 `json:"data_recv"`
	Pings      int64 `json:"pings_sent"`
	BdpPings   int64 `json:"bdp_pings_sent"`
	PingsIn    int64 `json:"pings_recv"`
	BdpPingsIn int64 `json:"bdp_pings_recv"`
	PingAcks   int64 `json:"ping_acks_sent"`
	PingAcksIn int64 `json:"ping_acks_recv"`
	Rst        int64 `json:"rst_sent"`
	RstIn      int64 `json:"rst_recv"`
	Goaway     int64 `json:"goaway_sent"`
	GoawayIn   int64 `json:"goaway_recv"`

	mu      sync.Mutex
	goaways []string
}

func (s *wireStats) snapshot() map[string]interface{} {
	b, _ := json.Marshal(s)
	var m map[string]interface{}
	_ = json.Unmarshal(b, &m)
	s.mu.Lock()
	m["goaways"] = append([]string{}, s.goaways...)
	s.mu.Unlock()
	return m
}

var errCodeNames = map[uint32]string{
	0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
	4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
	8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM",
	12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED",
}

type frameParser struct {
	role    string // for log lines, e.g. "upstream"
	sent    bool   // direction: frames we write (true) or read
	stats   *wireStats
	preface int // bytes of the client preface still to skip

	hdr       [9]byte
	hn        int
	remaining uint32
	typ       byte
	flags     byte
	stream    uint32
	keep      int
	payload   []byte

	// onFrame (the kill matrix's trap) is called with each completed frame's type, flags and
	// stream, and the offset just past it in the chunk being fed; it returns whether the rest
	// of that chunk is to be cut off.
	onFrame func(typ, flags byte, stream uint32, end int) bool
	fed     int // bytes of the current chunk consumed so far
	cutAt   int // >= 0: onFrame asked to cut the chunk here
	// The connection's recent frames (upstream connections of a bridge), for a slow call's dump.
	ring *frameRing
}

// frameRing keeps the last frames of one connection, both directions, with their times.
type frameRing struct {
	mu       sync.Mutex
	name     string
	opened   time.Time
	closed   time.Time
	closeErr string
	buf      []string
	next     int
}

const ringSize = 64

var frameNames = map[byte]string{0: "DATA", 1: "HEADERS", 2: "PRIORITY", 3: "RST_STREAM", 4: "SETTINGS", 5: "PUSH_PROMISE", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE", 9: "CONTINUATION"}

func (r *frameRing) add(line string) {
	r.mu.Lock()
	if len(r.buf) < ringSize {
		r.buf = append(r.buf, line)
	} else {
		r.buf[r.next] = line
		r.next = (r.next + 1) % ringSize
	}
	r.mu.Unlock()
}

func (r *frameRing) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	closed := "open"
	if !r.closed.IsZero() {
		closed = "closed " + r.closed.Format("15:04:05.000000") + " (" + r.closeErr + ")"
	}
	fmt.Fprintf(&b, "  %s connection opened %s, %s; its last %d frames:\n", r.name, r.opened.Format("15:04:05.000000"), closed, len(r.buf))
	for i := 0; i < len(r.buf); i++ {
		b.WriteString("    " + r.buf[(r.next+i)%len(r.buf)] + "\n")
	}
	return b.String()
}

// upstreamRings: the rings of a bridge's upstream connections, newest last (at most 8 kept).
var upstreamRings struct {
	sync.Mutex
	all []*frameRing
}

func addRing(r *frameRing) {
	upstreamRings.Lock()
	upstreamRings.all = append(upstreamRings.all, r)
	if len(upstreamRings.all) > 8 {
		upstreamRings.all = upstreamRings.all[len(upstreamRings.all)-8:]
	}
	upstreamRings.Unlock()
}

func dumpRings() string {
	upstreamRings.Lock()
	rs := append([]*frameRing(nil), upstreamRings.all...)
	upstreamRings.Unlock()
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(r.dump())
	}
	return b.String()
}

func (p *frameParser) feed(b []byte) {
	total := len(b)
	p.cutAt = -1
	for len(b) > 0 {
		p.fed = total - len(b)
		if p.preface > 0 {
			n := p.preface
			if n > len(b) {
				n = len(b)
			}
			p.preface -= n
			b = b[n:]
			continue
		}
		if p.hn < 9 {
			n := copy(p.hdr[p.hn:], b)
			p.hn += n
			b = b[n:]
			if p.hn == 9 {
				p.remaining = uint32(p.hdr[0])<<16 | uint32(p.hdr[1])<<8 | uint32(p.hdr[2])
				p.typ, p.flags = p.hdr[3], p.hdr[4]
				p.stream = (uint32(p.hdr[5])<<24 | uint32(p.hdr[6])<<16 | uint32(p.hdr[7])<<8 | uint32(p.hdr[8])) & 0x7fffffff
				p.payload = p.payload[:0]
				switch p.typ {
				case 0x3: // RST_STREAM
					p.keep = 4
				case 0x6: // PING
					p.keep = 8
				case 0x7: // GOAWAY
					p.keep = 8 + 200
				default:
					p.keep = 0
				}
				if p.remaining == 0 {
					p.fed = total - len(b)
					p.done()
				}
			}
			continue
		}
		n := uint32(len(b))
		if n > p.remaining {
			n = p.remaining
		}
		if want := p.keep - len(p.payload); want > 0 {
			k := int(n)
			if k > want {
				k = want
			}
			p.payload = append(p.payload, b[:k]...)
		}
		p.remaining -= n
		b = b[n:]
		if p.remaining == 0 {
			p.fed = total - len(b)
			p.done()
		}
	}
}

func (p *frameParser) done() {
	p.hn = 0
	if p.ring != nil {
		dir := "<-"
		if p.sent {
			dir = "->"
		}
		n := uint32(p.hdr[0])<<16 | uint32(p.hdr[1])<<8 | uint32(p.hdr[2])
		p.ring.add(fmt.Sprintf("%s %s %s stream=%d flags=0x%x len=%d", time.Now().Format("15:04:05.000000"), dir, frameNames[p.typ], p.stream, p.flags, n))
	}
	if p.onFrame != nil && p.cutAt < 0 && p.onFrame(p.typ, p.flags, p.stream, p.fed) {
		p.cutAt = p.fed
	}
	s := p.stats
	pick := func(sent, recv *int64) {
		if p.sent {
			atomic.AddInt64(sent, 1)
		} else {
			atomic.AddInt64(recv, 1)
		}
	}
	switch p.typ {
	case 0x0:
		pick(&s.Data, &s.DataIn)
	case 0x1:
		pick(&s.Headers, &s.HeadersIn)
	case 0x3:
		pick(&s.Rst, &s.RstIn)
	case 0x6:
		if p.flags&0x1 != 0 {
			pick(&s.PingAcks, &s.PingAcksIn)
			return
		}
		pick(&s.Pings, &s.PingsIn)
		if len(p.payload) == 8 && [8]byte{p.payload[0], p.payload[1], p.payload[2], p.payload[3], p.payload[4], p.payload[5], p.payload[6], p.payload[7]} == bdpPingData {
			pick(&s.BdpPings, &s.BdpPingsIn)
		}
	case 0x7:
		pick(&s.Goaway, &s.GoawayIn)
		var last, code uint32
		var debug []byte
		if len(p.payload) >= 8 {
			last = (uint32(p.payload[0])<<24 | uint32(p.payload[1])<<16 | uint32(p.payload[2])<<8 | uint32(p.payload[3])) & 0x7fffffff
			code = uint32(p.payload[4])<<24 | uint32(p.payload[5])<<16 | uint32(p.payload[6])<<8 | uint32(p.payload[7])
			debug = p.payload[8:]
		}
		dir := "received"
		if p.sent {
			dir = "sent"
		}
		name := errCodeNames[code]
		if name == "" {
			name = "UNKNOWN"
		}
		line := fmt.Sprintf("%s GOAWAY %s last_stream=%d error_code=%d(%s) debug=%q", p.role, dir, last, code, name, debug)
		s.mu.Lock()
		if len(s.goaways) < 20 {
			s.goaways = append(s.goaways, line)
		}
		s.mu.Unlock()
		fmt.Fprintf(os.Stderr, "%s crisp-grpcgo: %s\n", time.Now().Format("15:04:05.000000"), line)
	}
}

type sniffConn struct {
	net.Conn
	rd, wr *frameParser
	rmu    sync.Mutex
	wmu    sync.Mutex
	// After a trap cut the stream of frames from the server: reads end as if the server had
	// died right after the frame the trap fired on.
	cut bool
	// Run after a Read's or Write's frames were fed (the trap's kill), before the bytes go on.
	afterRead, afterWrite func()
	// The trap's hold: while gate is set, a Write waits for it (held is closed at the first).
	hmu      sync.Mutex
	gate     chan struct{}
	held     chan struct{}
	heldOnce sync.Once
}

// hold makes the next Writes wait until the returned release is called.
func (c *sniffConn) hold() (release func()) {
	g := make(chan struct{})
	c.hmu.Lock()
	c.gate = g
	c.hmu.Unlock()
	return func() {
		c.hmu.Lock()
		c.gate = nil
		c.hmu.Unlock()
		close(g)
	}
}

func (c *sniffConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	cut := c.cut
	c.rmu.Unlock()
	if cut {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(b)
	if err != nil && c.rd.ring != nil {
		c.rd.ring.mu.Lock()
		if c.rd.ring.closed.IsZero() {
			c.rd.ring.closed = time.Now()
			c.rd.ring.closeErr = err.Error()
		}
		c.rd.ring.mu.Unlock()
	}
	if n > 0 {
		c.rmu.Lock()
		c.rd.feed(b[:n])
		if c.rd.cutAt >= 0 {
			n = c.rd.cutAt
			c.cut = true
		}
		c.rmu.Unlock()
		if c.afterRead != nil {
			c.afterRead()
		}
	}
	return n, err
}

func (c *sniffConn) Write(b []byte) (int, error) {
	c.hmu.Lock()
	g := c.gate
	c.hmu.Unlock()
	if g != nil {
		c.heldOnce.Do(func() { close(c.held) })
		<-g
	}
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.wmu.Lock()
		c.wr.feed(b[:n])
		c.wmu.Unlock()
		if c.afterWrite != nil {
			c.afterWrite()
		}
	}
	return n, err
}

// sniff wraps a connection; `client` says which end of HTTP/2 we are (the client writes the
// 24-byte preface, the server reads it).
func sniff(c net.Conn, role string, client bool, st *wireStats) net.Conn {
	atomic.AddInt64(&st.Conns, 1)
	rd := &frameParser{role: role, sent: false, stats: st}
	wr := &frameParser{role: role, sent: true, stats: st}
	if client {
		wr.preface = len(http2.ClientPreface)
	} else {
		rd.preface = len(http2.ClientPreface)
	}
	return &sniffConn{Conn: c, rd: rd, wr: wr, held: make(chan struct{})}
}

type sniffListener struct {
	net.Listener
	role  string
	stats *wireStats
}

func (l *sniffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return sniff(c, l.role, false, l.stats), nil
}

// ---------------------------------------------------------------------------------------------
// The kubelet-style client connection.

// dialKubelet dials `target` as kubelet 1.20-1.27 does (pkg/kubelet/cri/remote): the bare
// socket path as the gRPC target (passthrough resolver), insecure, a unix context dialer, 16 MiB
// message limits, no keep-alive. `authority` overrides :authority (kubelet 1.29 sends the path
// percent-encoded; other clients `localhost`).
func dialKubelet(name, target, authority string, st *wireStats, sh stats.Handler, tr *trap) (*grpc.ClientConn, error) {
	path := strings.TrimPrefix(target, "unix://")
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		if tr != nil {
			tr.waitStarted()
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		if st == nil {
			// bench: the connection as kubelet has it, with no frame counting on it.
			return c, nil
		}
		sc := sniff(c, "upstream", true, st).(*sniffConn)
		if name != "" {
			r := &frameRing{name: name, opened: time.Now()}
			sc.rd.ring, sc.wr.ring = r, r
			addRing(r)
		}
		if tr != nil {
			tr.connected(sc, path)
		}
		return sc, nil
	}
	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
	}
	if authority != "" {
		opts = append(opts, grpc.WithAuthority(authority))
	}
	if sh != nil {
		opts = append(opts, grpc.WithStatsHandler(sh))
	}
	return grpc.Dial(target, opts...)
}

// ---------------------------------------------------------------------------------------------
// bridge

// headerWatch tells the forwarding goroutine whether the upstream answered with a real HEADERS
// frame (to be forwarded at once, as a streaming call needs) or trailers only (forwarded as
// trailers only). It rides in the call's context; the stats handler fills it in.
type headerWatch struct {
	once sync.Once
	ch   chan struct{}
	real bool
}

type watchKey struct{}

func (w *headerWatch) settle(real bool) {
	w.once.Do(func() {
		w.real = real
		close(w.ch)
	})
}

type watchHandler struct{}

func (watchHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (watchHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (watchHandler) HandleConn(context.Context, stats.ConnStats) {}
func (watchHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if q, _ := ctx.Value(trapQueuedKey{}).(func()); q != nil {
		if _, ok := s.(*stats.OutPayload); ok {
			q()
		}
	}
	w, _ := ctx.Value(watchKey{}).(*headerWatch)
	if w == nil {
		return
	}
	switch s.(type) {
	case *stats.InHeader:
		w.settle(true)
	case *stats.InTrailer, *stats.End:
		w.settle(false)
	}
}

// kubelet dials its runtime and image endpoints separately (two grpc.ClientConns even when
// both name the same socket), so the bridge keeps two connections too.
type bridge struct {
	runtime *grpc.ClientConn
	image   *grpc.ClientConn
}

func (b *bridge) conn(method string) *grpc.ClientConn {
	if strings.Contains(method, ".ImageService/") {
		return b.image
	}
	return b.runtime
}

// Request metadata grpc-go manages itself (or kubelet never sends) is not copied.
func outgoingMD(in metadata.MD) metadata.MD {
	out := metadata.MD{}
	for k, v := range in {
		if strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") {
			continue
		}
		switch k {
		case "content-type", "user-agent", "te", "content-length", "accept-encoding":
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

func (b *bridge) handle(_ interface{}, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "crisp-grpcgo: no method")
	}
	in := ss.Context()
	// A call still unanswered after slowCall: its method, the client connection's state and the
	// upstream connections' last frames go to the log (the open chaos hang, RELIABILITY.md).
	conn := b.conn(method)
	started := time.Now()
	stateAtStart := conn.GetState()
	slow := time.AfterFunc(slowCall, func() {
		fmt.Fprintf(os.Stderr, "%s crisp-grpcgo: SLOW CALL %s started %s (client connection %v then, %v now), unanswered after %v\n%s",
			time.Now().Format("15:04:05.000000"), method, started.Format("15:04:05.000000"), stateAtStart, conn.GetState(), slowCall, dumpRings())
	})
	defer slow.Stop()
	// Read the request first: a call whose client sends one message and half-closes (every
	// unary and server-streaming CRI call) goes out as kubelet sends it, DATA with END_STREAM.
	var first []byte
	var msgs [][]byte
	single := false
	if err := ss.RecvMsg(&first); err == nil {
		msgs = append(msgs, first)
		var second []byte
		switch err := ss.RecvMsg(&second); {
		case err == io.EOF:
			single = true
		case err != nil:
			return err
		default:
			msgs = append(msgs, second)
		}
	} else if err != io.EOF {
		return err
	}

	ctx, cancel := context.WithCancel(in)
	defer cancel()
	md, _ := metadata.FromIncomingContext(in)
	ctx = metadata.NewOutgoingContext(ctx, outgoingMD(md))
	watch := &headerWatch{ch: make(chan struct{})}
	ctx = context.WithValue(ctx, watchKey{}, watch)
	if activeTrap != nil && len(md.Get("x-crisp-trap")) > 0 && md.Get("x-crisp-trap")[0] == "queued" {
		ctx = context.WithValue(ctx, trapQueuedKey{}, activeTrap.signalQueued)
	}

	// A unary call goes out as kubelet makes it: the generated client's Invoke (a stream,
	// SendMsg, RecvMsg — with grpc-go's transparent retry of a stream the server never saw).
	// Not through NewStream + Header(): when the transport closes after a stream was queued
	// but before its HEADERS were written, grpc-go 1.33 ends that stream "unprocessed" without
	// a status, Header() returns no header and no error, and no stats event follows until
	// RecvMsg — the old forwarder waited for one until the call's deadline (RELIABILITY.md,
	// the chaos hang). `--forward stream` keeps the old forwarder, to show it.
	if single && forwardMode == "invoke" && !strings.HasSuffix(method, "/GetContainerEvents") {
		var resp []byte
		var hdr, trl metadata.MD
		err := b.conn(method).Invoke(ctx, method, msgs[0], &resp, grpc.ForceCodec(rawCodec{}), grpc.Header(&hdr), grpc.Trailer(&trl))
		ss.SetTrailer(trl)
		if err != nil {
			if len(hdr) > 0 {
				_ = ss.SendHeader(hdr)
			}
			return status.Convert(err).Err()
		}
		if len(hdr) > 0 {
			if err := ss.SendHeader(hdr); err != nil {
				return err
			}
		}
		return ss.SendMsg(resp)
	}

	desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true, ClientStreams: !single}
	cs, err := b.conn(method).NewStream(ctx, desc, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return status.Convert(err).Err()
	}
	sendFailed := false
	for _, m := range msgs {
		if err := cs.SendMsg(m); err != nil {
			// io.EOF: the stream ended; RecvMsg below reports why.
			sendFailed = true
			break
		}
	}
	if !single && !sendFailed {
		go func() {
			for {
				var m []byte
				if err := ss.RecvMsg(&m); err != nil {
					if err == io.EOF {
						_ = cs.CloseSend()
					} else {
						cancel()
					}
					return
				}
				if err := cs.SendMsg(m); err != nil {
					return
				}
			}
		}()
	}

	// Forward the response headers as soon as they arrive (a stream's may come long before its
	// first message). Header() returns once headers, trailers only, or an error ended the wait;
	// an empty header set is told apart from trailers only by the stats event, which grpc-go
	// raises right after (same frame).
	if hdr, err := cs.Header(); err == nil {
		real := len(hdr) > 0
		if !real {
			// The event comes with the same frame; a stream that ends before any frame (see
			// above) raises none, so the wait is bounded (the old forwarder's was not).
			var bound <-chan time.Time
			if forwardMode == "invoke" {
				bound = time.After(time.Second)
			}
			select {
			case <-watch.ch:
				real = watch.real
			case <-ctx.Done():
			case <-bound:
			}
		}
		if real {
			if err := ss.SendHeader(hdr); err != nil {
				return err
			}
		}
	}
	for {
		var m []byte
		err := cs.RecvMsg(&m)
		if err == io.EOF {
			ss.SetTrailer(cs.Trailer())
			return nil
		}
		if err != nil {
			ss.SetTrailer(cs.Trailer())
			return status.Convert(err).Err()
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// logStates writes each connectivity state of a bridge's client connection to stderr, with the
// time: a call that hangs can then be placed in the connection's life (reconnecting, or ready
// and waiting for an answer).
func logStates(name string, cc *grpc.ClientConn) {
	s := cc.GetState()
	for {
		fmt.Fprintf(os.Stderr, "%s crisp-grpcgo: %s client connection %v\n", time.Now().Format("15:04:05.000000"), name, s)
		if !cc.WaitForStateChange(context.Background(), s) {
			return
		}
		s = cc.GetState()
	}
}

func runBridge(args []string) error {
	fs := flag.NewFlagSet("bridge", flag.ExitOnError)
	listen := fs.String("listen", "", "unix socket to serve on")
	target := fs.String("target", "", "gRPC target to forward to (a socket path, as kubelet dials)")
	authority := fs.String("authority", "", "override :authority (e.g. %2Frun%2Fx.sock or localhost)")
	policy := fs.String("server-keepalive-policy", "default", "default (grpc-go/containerd: MinTime 5m, PermitWithoutStream false) or permissive")
	trapPoint := fs.String("trap", "", "kill matrix: SIGKILL --trap-pid at this point of the runtime connection: connect|accepted|settings|request|response")
	trapPid := fs.Int("trap-pid", 0, "the process the trap kills")
	trapAfter := fs.Duration("trap-after", 0, "the trap's calls go this long after the kill")
	trapTimeout := fs.Duration("trap-timeout", 30*time.Second, "deadline of the trap's calls")
	trapMethod := fs.String("trap-method", "/runtime.v1.RuntimeService/ListPodSandbox", "the trap's call on the runtime connection")
	trapImageMethod := fs.String("trap-image-method", "/runtime.v1.ImageService/ImageFsInfo", "the trap's call on the image connection (empty: none)")
	forward := fs.String("forward", "invoke", "invoke (unary calls as kubelet makes them) or stream (the old forwarder, which can hang after a kill)")
	_ = fs.Parse(args)
	switch *forward {
	case "invoke", "stream":
		forwardMode = *forward
	default:
		return fmt.Errorf("unknown --forward %q", *forward)
	}
	if *listen == "" || *target == "" {
		return errors.New("--listen and --target are required")
	}
	up := &wireStats{}
	down := &wireStats{}
	var outMu sync.Mutex
	tr, err := newTrap(*trapPoint, *trapPid, *trapAfter, *trapTimeout, *trapMethod, *trapImageMethod, func(v interface{}) {
		b, _ := json.Marshal(v)
		outMu.Lock()
		fmt.Fprintf(os.Stdout, "%s\n", b)
		outMu.Unlock()
		fmt.Fprintf(os.Stderr, "%s crisp-grpcgo: trap %s\n", time.Now().Format("15:04:05.000000"), b)
	})
	if err != nil {
		return err
	}
	cc, err := dialKubelet("runtime", *target, *authority, up, watchHandler{}, tr)
	if err != nil {
		return fmt.Errorf("dial %s: %v", *target, err)
	}
	defer cc.Close()
	icc, err := dialKubelet("image", *target, *authority, up, watchHandler{}, nil)
	if err != nil {
		return fmt.Errorf("dial %s: %v", *target, err)
	}
	defer icc.Close()
	go logStates("runtime", cc)
	go logStates("image", icc)

	sopts := []grpc.ServerOption{
		grpc.CustomCodec(rawCodec{}),
		grpc.UnknownServiceHandler((&bridge{runtime: cc, image: icc}).handle),
		grpc.MaxRecvMsgSize(maxMsgSize),
		grpc.MaxSendMsgSize(maxMsgSize),
	}
	switch *policy {
	case "default":
		// grpc-go's defaults, as containerd runs them.
	case "permissive":
		sopts = append(sopts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Nanosecond, PermitWithoutStream: true}))
	default:
		return fmt.Errorf("unknown --server-keepalive-policy %q", *policy)
	}
	srv := grpc.NewServer(sopts...)

	if err := os.Remove(*listen); err != nil && !os.IsNotExist(err) {
		return err
	}
	l, err := net.Listen("unix", *listen)
	if err != nil {
		return err
	}
	if err := os.Chmod(*listen, 0660); err != nil {
		return err
	}

	printStats := func(w io.Writer) {
		b, _ := json.Marshal(map[string]interface{}{"stats": map[string]interface{}{"upstream": up.snapshot(), "downstream": down.snapshot()}})
		fmt.Fprintf(w, "%s\n", b)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sigs {
			if s == syscall.SIGUSR1 {
				outMu.Lock()
				printStats(os.Stdout)
				outMu.Unlock()
				continue
			}
			printStats(os.Stderr)
			srv.Stop()
			_ = os.Remove(*listen)
			os.Exit(0)
		}
	}()

	outMu.Lock()
	fmt.Fprintln(os.Stdout, "ready")
	outMu.Unlock()
	fmt.Fprintf(os.Stderr, "%s crisp-grpcgo: bridge %s -> %s (grpc-go %s, authority %q)\n", time.Now().Format("15:04:05.000000"), *listen, *target, grpc.Version, *authority)
	if tr != nil {
		activeTrap = tr
		tr.start(*listen)
	}
	return srv.Serve(&sniffListener{Listener: l, role: "downstream", stats: down})
}

// ---------------------------------------------------------------------------------------------
// The kill matrix's trap (e2e/tests/it/reliability_crisp_chaos.rs): SIGKILL a process (crisp) at
// a protocol point of the bridge's first runtime connection, then make a call on each of the
// bridge's client connections a set time later. The calls go through the bridge's own server,
// as the kubelet emulator's do, so they take the bridge's real forwarding path (`--forward`).
// Events are JSON lines on stdout (and stderr, with the time, beside the connection states):
//
//	{"trap":"killed","point":P,"at":T}
//	{"trap":"call","conn":"trigger|runtime|image","method":M,"code":C,"message":S,"ms":F,"sent_after_kill_ms":F}
//
// Points: connect (the socket connected, the client's preface not written: the connection may
// still wait in the listener's backlog), accepted (the same once the listener's backlog is empty,
// i.e. crisp accepted it: `ss`), settings (the server's SETTINGS read by the client), request
// (a request's HEADERS written; the bridge makes a trigger call for it), response (the trigger
// call's response HEADERS read, and the connection cut right after that frame, as if crisp had
// died between writing it and the rest), queued (the connection's writer held inside a write of
// the trigger call, the runtime call queued behind it, then the kill, then the writer let go:
// the call is queued on a transport that closes before writing it — the chaos hang's moment).

type trap struct {
	point       string
	pid         int
	after       time.Duration
	timeout     time.Duration
	method      string
	imageMethod string
	out         func(interface{})
	startedCh   chan struct{}
	fired       int32
	conns       int32
	down        *grpc.ClientConn
	rconn       chan *sniffConn
	queuedCh    chan struct{}
	queuedOnce  sync.Once
}

func newTrap(point string, pid int, after, timeout time.Duration, method, imageMethod string, out func(interface{})) (*trap, error) {
	switch point {
	case "":
		return nil, nil
	case "connect", "accepted", "settings", "request", "response", "queued":
	default:
		return nil, fmt.Errorf("unknown --trap %q", point)
	}
	if pid <= 0 {
		return nil, errors.New("--trap needs --trap-pid")
	}
	return &trap{point: point, pid: pid, after: after, timeout: timeout, method: method, imageMethod: imageMethod, out: out,
		startedCh: make(chan struct{}), rconn: make(chan *sniffConn, 1), queuedCh: make(chan struct{})}, nil
}

func (t *trap) waitStarted() { <-t.startedCh }

func (t *trap) signalQueued() { t.queuedOnce.Do(func() { close(t.queuedCh) }) }

// start: the bridge listens on `listen` and printed `ready`; the runtime connection may dial.
func (t *trap) start(listen string) {
	down, err := grpc.Dial(listen, grpc.WithInsecure(), grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", listen)
	}))
	if err != nil {
		t.out(map[string]interface{}{"trap": "error", "error": err.Error()})
		return
	}
	t.down = down
	close(t.startedCh)
	switch t.point {
	case "request", "response":
		// The trigger call, on the connection's first stream.
		go t.call("trigger", t.method, "", time.Time{})
	case "queued":
		go t.queued()
	}
}

func (t *trap) queued() {
	c := <-t.rconn
	for t.down != nil {
		// The runtime connection is up (its SETTINGS exchanged) before the writer is held.
		c.rmu.Lock()
		up := c.rd.ring == nil || len(c.rd.ring.buf) >= 2
		c.rmu.Unlock()
		if up {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	release := c.hold()
	go t.call("trigger", t.method, "", time.Time{})
	select {
	case <-c.held:
	case <-time.After(5 * time.Second):
		t.out(map[string]interface{}{"trap": "error", "error": "the trigger call was never written"})
	}
	go t.call("runtime", t.method, "queued", time.Now())
	select {
	case <-t.queuedCh:
	case <-time.After(5 * time.Second):
		t.out(map[string]interface{}{"trap": "error", "error": "the runtime call was never queued"})
	}
	t.kill()
	// The reader sees the end of the connection and closes the transport; then the writer goes on.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		c.rd.ring.mu.Lock()
		closed := !c.rd.ring.closed.IsZero()
		c.rd.ring.mu.Unlock()
		if closed {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	release()
}

// connected: the runtime connection's dial returned (only the first one is trapped).
func (t *trap) connected(c *sniffConn, path string) {
	if atomic.AddInt32(&t.conns, 1) != 1 {
		return
	}
	var pending int32
	fireIfPending := func() {
		if atomic.CompareAndSwapInt32(&pending, 1, 2) {
			t.fire()
		}
	}
	switch t.point {
	case "connect":
		t.fire()
	case "accepted":
		deadline := time.Now().Add(2 * time.Second)
		for backlog(path) != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		t.fire()
	case "settings":
		c.rd.onFrame = func(typ, flags byte, stream uint32, end int) bool {
			if typ == 0x4 && flags&0x1 == 0 {
				atomic.CompareAndSwapInt32(&pending, 0, 1)
			}
			return false
		}
		c.afterRead = fireIfPending
	case "request":
		c.wr.onFrame = func(typ, flags byte, stream uint32, end int) bool {
			if typ == 0x1 && stream != 0 {
				atomic.CompareAndSwapInt32(&pending, 0, 1)
			}
			return false
		}
		c.afterWrite = fireIfPending
	case "response":
		c.rd.onFrame = func(typ, flags byte, stream uint32, end int) bool {
			if typ == 0x1 && stream != 0 && flags&0x1 == 0 {
				return atomic.CompareAndSwapInt32(&pending, 0, 1)
			}
			return false
		}
		c.afterRead = fireIfPending
	case "queued":
		t.rconn <- c
	}
}

// backlog: connections waiting in the backlog of the listening unix socket at path (`ss`'s
// Recv-Q of a listener), or -1 if unknown.
func backlog(path string) int {
	out, err := exec.Command("ss", "-xlnH").Output()
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && f[4] == path {
			n := 0
			fmt.Sscanf(f[2], "%d", &n)
			return n
		}
	}
	return -1
}

// kill: SIGKILL the process, once; reports it. Returns when, or the zero time if already done.
func (t *trap) kill() time.Time {
	if !atomic.CompareAndSwapInt32(&t.fired, 0, 1) {
		return time.Time{}
	}
	err := syscall.Kill(t.pid, syscall.SIGKILL)
	at := time.Now()
	ev := map[string]interface{}{"trap": "killed", "point": t.point, "at": at.UTC().Format(time.RFC3339Nano)}
	if err != nil {
		ev["error"] = err.Error()
	}
	t.out(ev)
	return at
}

// fire: the kill, then the runtime and image calls `after` later.
func (t *trap) fire() {
	at := t.kill()
	if at.IsZero() {
		return
	}
	go func() {
		if t.after > 0 {
			time.Sleep(time.Until(at.Add(t.after)))
		}
		go t.call("runtime", t.method, "", at)
		if t.imageMethod != "" {
			go t.call("image", t.imageMethod, "", at)
		}
	}()
}

// call makes one unary call through the bridge's own server (empty request message).
func (t *trap) call(conn, method, mark string, killed time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	if mark != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-crisp-trap", mark)
	}
	t0 := time.Now()
	var resp []byte
	err := t.down.Invoke(ctx, method, []byte{}, &resp, grpc.ForceCodec(rawCodec{}))
	took := time.Since(t0)
	st := status.Convert(err)
	ev := map[string]interface{}{"trap": "call", "conn": conn, "method": method, "code": st.Code().String(), "message": st.Message(), "ms": float64(took.Microseconds()) / 1000, "at": t0.UTC().Format(time.RFC3339Nano)}
	if !killed.IsZero() {
		ev["sent_after_kill_ms"] = float64(t0.Sub(killed).Microseconds()) / 1000
	}
	t.out(ev)
}

// ---------------------------------------------------------------------------------------------
// call

type callResult struct {
	At          string  `json:"at"`
	Code        string  `json:"code"`
	Message     string  `json:"message"`
	ResponseHex string  `json:"response_hex"`
	Ms          float64 `json:"ms"`
	// The response's header and trailer metadata as grpc-go hands them to its caller (lines
	// printed per call only).
	Header  metadata.MD `json:"header,omitempty"`
	Trailer metadata.MD `json:"trailer,omitempty"`
	// --stream: every response message, in order.
	ResponsesHex []string `json:"responses_hex,omitempty"`
}

// mdFlags: repeated `--md key=value`, request metadata sent with every call (kubelet's tracing
// sends traceparent, tracestate and baggage this way).
type mdFlags []string

func (m *mdFlags) String() string     { return strings.Join(*m, ",") }
func (m *mdFlags) Set(v string) error { *m = append(*m, v); return nil }

func (m mdFlags) parse() (metadata.MD, error) {
	out := metadata.MD{}
	for _, kv := range m {
		i := strings.IndexByte(kv, '=')
		if i <= 0 {
			return nil, fmt.Errorf("--md %q: want key=value", kv)
		}
		out.Append(kv[:i], kv[i+1:])
	}
	return out, nil
}

// streamCall makes one server-streaming call as kubelet's generated client does for the CRI's
// streaming methods (GetContainerEvents, 1.36's Stream* list calls): NewStream, SendMsg,
// CloseSend, RecvMsg until the status; every message, the header and the trailer are kept.
func streamCall(ctx context.Context, cc *grpc.ClientConn, method string, req []byte) callResult {
	t0 := time.Now()
	r := callResult{At: t0.UTC().Format(time.RFC3339Nano), ResponsesHex: []string{}}
	desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true}
	cs, err := cc.NewStream(ctx, desc, method, grpc.ForceCodec(rawCodec{}))
	if err == nil {
		if err = cs.SendMsg(req); err == nil || err == io.EOF {
			err = cs.CloseSend()
		}
		if err == nil || err == io.EOF {
			for {
				var m []byte
				if err = cs.RecvMsg(&m); err != nil {
					break
				}
				r.ResponsesHex = append(r.ResponsesHex, hex.EncodeToString(m))
			}
			if err == io.EOF {
				err = nil
			}
		}
		r.Header, _ = cs.Header()
		r.Trailer = cs.Trailer()
	}
	st := status.Convert(err)
	r.Code, r.Message = st.Code().String(), st.Message()
	r.Ms = float64(time.Since(t0).Microseconds()) / 1000
	return r
}

func runCall(args []string) error {
	fs := flag.NewFlagSet("call", flag.ExitOnError)
	target := fs.String("target", "", "gRPC target (a socket path, as kubelet dials)")
	method := fs.String("method", "", "full method, e.g. /runtime.v1.RuntimeService/Version")
	authority := fs.String("authority", "", "override :authority")
	hexReq := fs.String("hex", "", "request message as hex (default: read hex from stdin)")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of each call")
	count := fs.Int("count", 1, "number of calls")
	concurrency := fs.Int("concurrency", 1, "calls in flight at once")
	each := fs.Bool("each", false, "print every call's result even with --count > 1")
	errorsOnly := fs.Bool("errors", false, "print a line for every failed call")
	interval := fs.Duration("interval", 0, "each worker starts one call per interval (0: back to back)")
	duration := fs.Duration("duration", 0, "keep calling until this has passed (instead of --count calls)")
	warmup := fs.Int("warmup", 0, "calls made first, one at a time, and not measured")
	latencies := fs.Bool("latencies", false, "every measured call's latency (µs) in the summary")
	stream := fs.Bool("stream", false, "a server-streaming call: one line with every response message (--count 1 only)")
	var mdArgs mdFlags
	fs.Var(&mdArgs, "md", "request metadata key=value (repeatable)")
	_ = fs.Parse(args)
	outMD, err := mdArgs.parse()
	if err != nil {
		return err
	}
	if *stream && (*count != 1 || *duration != 0 || *concurrency > 1) {
		return errors.New("--stream makes one call: no --count, --duration or --concurrency")
	}
	if *target == "" || *method == "" {
		return errors.New("--target and --method are required")
	}
	reqText := *hexReq
	if reqText == "" {
		b, err := ioutil.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		reqText = string(b)
	}
	req, err := hex.DecodeString(strings.Join(strings.Fields(reqText), ""))
	if err != nil {
		return fmt.Errorf("request hex: %v", err)
	}
	if *concurrency < 1 {
		*concurrency = 1
	}
	wire := &wireStats{}
	cc, err := dialKubelet("", *target, *authority, wire, nil, nil)
	if err != nil {
		return err
	}
	defer cc.Close()
	withMD := func(ctx context.Context) context.Context {
		if len(outMD) == 0 {
			return ctx
		}
		return metadata.NewOutgoingContext(ctx, outMD)
	}
	if *stream {
		ctx, cancel := context.WithTimeout(withMD(context.Background()), *timeout)
		r := streamCall(ctx, cc, *method, req)
		cancel()
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		ok, failed := 1, 0
		if r.Code != codes.OK.String() {
			ok, failed = 0, 1
		}
		summary := map[string]interface{}{"summary": true, "ok": ok, "failed": failed, "codes": map[string]int{r.Code: 1}, "max_ms": r.Ms, "elapsed_ms": r.Ms, "wire": wire.snapshot()}
		if failed > 0 {
			summary["first_error"] = r.Code + ": " + r.Message
		}
		b, _ = json.Marshal(summary)
		fmt.Println(string(b))
		if failed > 0 {
			os.Exit(1)
		}
		return nil
	}

	for i := 0; i < *warmup; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		var resp []byte
		err := cc.Invoke(ctx, *method, req, &resp, grpc.ForceCodec(rawCodec{}))
		cancel()
		if err != nil {
			return fmt.Errorf("warm-up call %d: %v", i+1, err)
		}
	}

	printEach := *each || (*count == 1 && *duration == 0)
	var outMu sync.Mutex
	var mu sync.Mutex
	var lat []float64
	var latUs []float64
	codeCounts := map[string]int{}
	var firstErr string
	var ok, failed int
	var next int64 = -1
	var wg sync.WaitGroup
	start := time.Now()
	more := func() bool {
		n := atomic.AddInt64(&next, 1)
		if *duration > 0 {
			return time.Since(start) < *duration
		}
		return n < int64(*count)
	}
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			due := time.Now()
			for more() {
				if *interval > 0 {
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
					due = due.Add(*interval)
					if now := time.Now(); due.Before(now) {
						// Late (a slow call): the next one starts at once, then the pace resumes.
						due = now
					}
				}
				ctx, cancel := context.WithTimeout(withMD(context.Background()), *timeout)
				var resp []byte
				var hdr, trl metadata.MD
				t0 := time.Now()
				err := cc.Invoke(ctx, *method, req, &resp, grpc.ForceCodec(rawCodec{}), grpc.Header(&hdr), grpc.Trailer(&trl))
				took := time.Since(t0)
				ms := float64(took.Microseconds()) / 1000
				cancel()
				st := status.Convert(err)
				r := callResult{At: t0.UTC().Format(time.RFC3339Nano), Code: st.Code().String(), Message: st.Message(), ResponseHex: hex.EncodeToString(resp), Ms: ms, Header: hdr, Trailer: trl}
				mu.Lock()
				lat = append(lat, ms)
				if *latencies {
					latUs = append(latUs, float64(took.Nanoseconds())/1000)
				}
				codeCounts[r.Code]++
				if err == nil {
					ok++
				} else {
					failed++
					if firstErr == "" {
						firstErr = r.Code + ": " + r.Message
					}
				}
				mu.Unlock()
				if printEach || (*errorsOnly && err != nil) {
					b, _ := json.Marshal(r)
					outMu.Lock()
					fmt.Println(string(b))
					outMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Float64s(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		// nearest rank
		i := int(math.Ceil(p*float64(len(lat)))) - 1
		if i < 0 {
			i = 0
		}
		return lat[i]
	}
	summary := map[string]interface{}{
		"summary":    true,
		"ok":         ok,
		"failed":     failed,
		"codes":      codeCounts,
		"p50_ms":     pct(0.50),
		"p99_ms":     pct(0.99),
		"max_ms":     pct(1),
		"elapsed_ms": float64(elapsed.Microseconds()) / 1000,
		"wire":       wire.snapshot(),
	}
	if firstErr != "" {
		summary["first_error"] = firstErr
	}
	if *latencies {
		summary["latencies_us"] = latUs
	}
	b, _ := json.Marshal(summary)
	fmt.Println(string(b))
	if failed > 0 {
		os.Exit(1)
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// headers: what a client puts on the wire

func runHeaders(args []string) error {
	fs := flag.NewFlagSet("headers", flag.ExitOnError)
	listen := fs.String("listen", "", "unix socket to serve on")
	_ = fs.Parse(args)
	if *listen == "" {
		return errors.New("--listen is required")
	}
	if err := os.Remove(*listen); err != nil && !os.IsNotExist(err) {
		return err
	}
	l, err := net.Listen("unix", *listen)
	if err != nil {
		return err
	}
	var outMu sync.Mutex
	emit := func(v interface{}) {
		b, _ := json.Marshal(v)
		outMu.Lock()
		fmt.Println(string(b))
		outMu.Unlock()
	}
	fmt.Println("ready")
	var connID int64
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		id := atomic.AddInt64(&connID, 1)
		go func() {
			defer c.Close()
			if err := serveHeaders(c, id, emit); err != nil && err != io.EOF && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				fmt.Fprintf(os.Stderr, "crisp-grpcgo headers: conn %d: %v\n", id, err)
			}
		}()
	}
}

func serveHeaders(c net.Conn, id int64, emit func(interface{})) error {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return err
	}
	if string(preface) != http2.ClientPreface {
		return fmt.Errorf("bad preface %q", preface)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	var hbuf bytes.Buffer
	henc := hpack.NewEncoder(&hbuf)
	answer := func(stream uint32) error {
		hbuf.Reset()
		_ = henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		_ = henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: hbuf.Bytes(), EndHeaders: true}); err != nil {
			return err
		}
		if err := fr.WriteData(stream, false, []byte{0, 0, 0, 0, 0}); err != nil {
			return err
		}
		hbuf.Reset()
		_ = henc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: hbuf.Bytes(), EndHeaders: true, EndStream: true})
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					return err
				}
			}
		case *http2.MetaHeadersFrame:
			var hs [][2]string
			for _, h := range f.Fields {
				hs = append(hs, [2]string{h.Name, h.Value})
			}
			emit(map[string]interface{}{"conn": id, "stream": f.StreamID, "headers": hs})
			if f.StreamEnded() {
				if err := answer(f.StreamID); err != nil {
					return err
				}
			}
		case *http2.DataFrame:
			if n := len(f.Data()); n > 0 {
				if err := fr.WriteWindowUpdate(0, uint32(n)); err != nil {
					return err
				}
			}
			if f.StreamEnded() {
				if err := answer(f.StreamID); err != nil {
					return err
				}
			}
		case *http2.PingFrame:
			emit(map[string]interface{}{"conn": id, "ping": hex.EncodeToString(f.Data[:]), "ack": f.IsAck(), "bdp": f.Data == bdpPingData})
			if !f.IsAck() {
				if err := fr.WritePing(true, f.Data); err != nil {
					return err
				}
			}
		case *http2.GoAwayFrame:
			emit(map[string]interface{}{"conn": id, "goaway": f.ErrCode.String()})
			return nil
		}
	}
}

// ---------------------------------------------------------------------------------------------
// bench: lanes interleaved call by call

// procSample: what /proc says about a process at one moment (bench --watch).
type procSample struct {
	cpuTicks       uint64               // utime + stime, every thread's, the ended ones included
	switches       map[string][2]uint64 // per thread: voluntary, nonvoluntary
	rssKiB, hwmKiB uint64
}

// switchesSince: context switches since `before`, summed over the threads alive now (a thread
// that began since counts from zero; one that ended since is lost — the lanes' relay threads
// live as long as their connections, which outlive both samples).
func (p procSample) switchesSince(before procSample) (voluntary, nonvoluntary uint64) {
	for tid, now := range p.switches {
		then := before.switches[tid]
		voluntary += now[0] - then[0]
		nonvoluntary += now[1] - then[1]
	}
	return
}

// sampleProc samples `pid` and its descendants (socat serves each connection in a child it
// forks), summed.
func sampleProc(pid int) procSample {
	p := procSample{switches: map[string][2]uint64{}}
	sampleOne(pid, &p)
	return p
}

func sampleOne(pid int, p *procSample) {
	if b, err := ioutil.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// Fields after the command name, which may hold spaces: state is field 3, utime 14.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseUint(f[11], 10, 64)
				s, _ := strconv.ParseUint(f[12], 10, 64)
				p.cpuTicks += u + s
			}
		}
	}
	field := func(text, key string) uint64 {
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, key) {
				f := strings.Fields(l[len(key):])
				if len(f) > 0 {
					v, _ := strconv.ParseUint(f[0], 10, 64)
					return v
				}
			}
		}
		return 0
	}
	if b, err := ioutil.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		p.rssKiB += field(string(b), "VmRSS:")
		p.hwmKiB += field(string(b), "VmHWM:")
	}
	// /proc/PID/status counts the main thread's switches only: sum the threads.
	tasks, _ := ioutil.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		b, err := ioutil.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue
		}
		p.switches[fmt.Sprintf("%d/%s", pid, t.Name())] = [2]uint64{
			field(string(b), "voluntary_ctxt_switches:"),
			field(string(b), "nonvoluntary_ctxt_switches:"),
		}
		kids, _ := ioutil.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, k := range strings.Fields(string(kids)) {
			if c, err := strconv.Atoi(k); err == nil {
				sampleOne(c, p)
			}
		}
	}
}

type laneFlags []string

func (l *laneFlags) String() string     { return strings.Join(*l, ",") }
func (l *laneFlags) Set(v string) error { *l = append(*l, v); return nil }

func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	var lanes laneFlags
	fs.Var(&lanes, "lane", "NAME=TARGET (repeatable; the first is the baseline)")
	method := fs.String("method", "", "full method")
	hexReq := fs.String("hex", "", "request message as hex")
	authority := fs.String("authority", "", "override :authority")
	count := fs.Int("count", 1000, "measured calls per lane and run")
	warmup := fs.Int("warmup", 100, "unmeasured calls per lane before each run")
	runs := fs.Int("runs", 3, "runs (fresh connections each)")
	concurrency := fs.Int("concurrency", 1, "callers per lane (> 1: throughput mode)")
	seconds := fs.Float64("seconds", 1, "throughput mode: seconds per lane and run")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of each call")
	var also, watches laneFlags
	fs.Var(&also, "also", "METHOD=HEX: a further call in the same turn, after --method (repeatable)")
	pace := fs.Duration("pace", 0, "pause after every lane's turn")
	fs.Var(&watches, "watch", "NAME=PID: sample /proc/PID around the measured calls of lane NAME")
	_ = fs.Parse(args)
	if len(lanes) == 0 || *method == "" {
		return errors.New("--lane and --method are required")
	}
	req, err := hex.DecodeString(*hexReq)
	if err != nil {
		return fmt.Errorf("request hex: %v", err)
	}
	methods := []string{*method}
	reqs := [][]byte{req}
	for _, a := range also {
		kv := strings.SplitN(a, "=", 2)
		if len(kv) != 2 {
			return fmt.Errorf("--also %q: want METHOD=HEX", a)
		}
		b, err := hex.DecodeString(kv[1])
		if err != nil {
			return fmt.Errorf("--also %q: %v", a, err)
		}
		methods, reqs = append(methods, kv[0]), append(reqs, b)
	}
	watched := map[string]int{}
	for _, w := range watches {
		kv := strings.SplitN(w, "=", 2)
		pid := 0
		if len(kv) == 2 {
			pid, err = strconv.Atoi(kv[1])
		}
		if len(kv) != 2 || err != nil {
			return fmt.Errorf("--watch %q: want NAME=PID", w)
		}
		watched[kv[0]] = pid
	}
	names := make([]string, len(lanes))
	targets := make([]string, len(lanes))
	for i, l := range lanes {
		kv := strings.SplitN(l, "=", 2)
		if len(kv) != 2 {
			return fmt.Errorf("--lane %q: want NAME=TARGET", l)
		}
		names[i], targets[i] = kv[0], kv[1]
	}
	call := func(cc *grpc.ClientConn, m int) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		var resp []byte
		t0 := time.Now()
		err := cc.Invoke(ctx, methods[m], reqs[m], &resp, grpc.ForceCodec(rawCodec{}))
		return time.Since(t0), err
	}
	// A lane's turn: every method once, in order; the latency of each.
	turn := func(cc *grpc.ClientConn) ([]time.Duration, error) {
		ds := make([]time.Duration, len(methods))
		for m := range methods {
			d, err := call(cc, m)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", methods[m], err)
			}
			ds[m] = d
		}
		return ds, nil
	}
	one := func(cc *grpc.ClientConn) (time.Duration, error) { return call(cc, 0) }
	for r := 0; r < *runs; r++ {
		conns := make([]*grpc.ClientConn, len(lanes))
		for i := range lanes {
			cc, err := dialKubelet("", targets[i], *authority, nil, nil, nil)
			if err != nil {
				return err
			}
			conns[i] = cc
			for w := 0; w < *warmup; w++ {
				if _, err := turn(cc); err != nil {
					return fmt.Errorf("lane %s, warm-up: %v", names[i], err)
				}
			}
		}
		out := map[string]interface{}{"run": r + 1}
		if *concurrency <= 1 {
			// lat[m][i]: method m's latencies on lane i; the last index is the whole turn.
			lat := make([][][]float64, len(methods)+1)
			for m := range lat {
				lat[m] = make([][]float64, len(lanes))
			}
			before := map[string]procSample{}
			for name, pid := range watched {
				before[name] = sampleProc(pid)
			}
			// The lanes take turns in a new random order every round: in a fixed cycle each
			// lane always follows the same one, and what that one left in the caches (its own
			// code, the runtime's) moved a lane's p50 by up to 0.3x socat's added latency
			// (BENCHMARKS.md, issue #20). Seeded: runs are repeatable.
			rng := rand.New(rand.NewSource(int64(r) + 1))
			for c := 0; c < *count; c++ {
				for _, i := range rng.Perm(len(lanes)) {
					ds, err := turn(conns[i])
					if err != nil {
						return fmt.Errorf("lane %s: %v", names[i], err)
					}
					var sum time.Duration
					for m, d := range ds {
						lat[m][i] = append(lat[m][i], float64(d.Nanoseconds())/1000)
						sum += d
					}
					lat[len(methods)][i] = append(lat[len(methods)][i], float64(sum.Nanoseconds())/1000)
					if *pace > 0 {
						time.Sleep(*pace)
					}
				}
			}
			quantiles := func(byLane [][]float64) map[string]interface{} {
				res := map[string]interface{}{}
				for i, v := range byLane {
					sort.Float64s(v)
					at := func(p float64) float64 { return v[int(math.Round(float64(len(v)-1)*p))] }
					res[names[i]] = map[string]float64{"p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1)}
				}
				return res
			}
			out["latency"] = quantiles(lat[0])
			if len(methods) > 1 {
				per := map[string]interface{}{}
				for m, name := range methods {
					per[name] = quantiles(lat[m])
				}
				out["methods"] = per
				out["turn"] = quantiles(lat[len(methods)])
			}
			if len(watched) > 0 {
				w := map[string]interface{}{}
				for name, pid := range watched {
					after := sampleProc(pid)
					vol, nonvol := after.switchesSince(before[name])
					w[name] = map[string]interface{}{
						"turns":            *count,
						"cpu_ticks":        after.cpuTicks - before[name].cpuTicks,
						"voluntary_cs":     vol,
						"nonvoluntary_cs":  nonvol,
						"threads":          len(after.switches),
						"rss_kib_before":   before[name].rssKiB,
						"rss_kib_after":    after.rssKiB,
						"hwm_kib":          after.hwmKiB,
						"ticks_per_second": 100,
					}
				}
				out["watch"] = w
			}
		} else {
			res := map[string]float64{}
			for k := range lanes {
				i := (r + k) % len(lanes)
				var n, failed int64
				stop := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
				var wg sync.WaitGroup
				t0 := time.Now()
				for w := 0; w < *concurrency; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							if _, err := one(conns[i]); err != nil {
								atomic.AddInt64(&failed, 1)
							} else {
								atomic.AddInt64(&n, 1)
							}
						}
					}()
				}
				wg.Wait()
				if failed > 0 {
					return fmt.Errorf("lane %s: %d calls failed", names[i], failed)
				}
				res[names[i]] = float64(n) / time.Since(t0).Seconds()
			}
			out["calls_per_s"] = res
		}
		for _, cc := range conns {
			cc.Close()
		}
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
	}
	return nil
}
