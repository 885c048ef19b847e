// Package rendezvous is a small key-value store over TCP through which the
// ranks of a job meet before they have a communicator: rank 0 publishes
// NCCL's unique id, the others wait for it.
//
// It follows torchrun's convention: rank 0 serves the store at
// MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) connects to it as
// a client, and RANK and WORLD_SIZE say who is who (see FromEnv). A Store
// offers Set, Get (which waits until the key exists), Wait (for several
// keys) and Add (an atomic counter, for barriers and unique names; it
// refuses a sum past the range of int64), each bounded by its context's
// deadline or, when the context has none, by the Store's Timeout: nothing
// waits forever.
//
// The store holds a handful of small values for the life of a job; it is
// not a database. Keys and values are at most 1 MiB each, and a Server
// holds at most ServerOptions.MaxKeys keys and MaxBytes bytes (4096 and 64
// MiB by default); a Set or Add past them fails. A Server keeps every key
// until it is closed.
//
// # What a client can cost the server
//
// Every connection begins with a greeting (Hello, and with a secret the
// handshake below); until it has greeted, a connection costs little and
// keeps no rank out:
//
//   - it must greet within ServerOptions.HandshakeTimeout (5 s) of its
//     accept, or it is dropped;
//   - each frame of the greeting is checked as it is read, its op first,
//     then each length before the bytes it announces: the server reads at
//     most 49 bytes of each of the (at most two) frames and allocates one
//     buffer of that size for each (64 bytes in the Go runtime's size
//     classes), whatever the peer sends or announces;
//   - at most ServerOptions.MaxPending (256) such connections are kept: a
//     connection accepted past the cap closes the oldest of them, and so
//     does an Accept that fails for want of file descriptors (EMFILE,
//     ENFILE), which then accepts again at once. A Store whose connection
//     is closed before its greeting is answered dials again, so a rank
//     gets in however many connections that never greet are open (unless
//     more than MaxPending new ones arrive while it greets), even when
//     they hold every descriptor of the server's process.
//
// Any other failed Accept does not stop the server either: it backs off, 5
// ms doubling up to 1 s, and accepts again. Once greeted, a request must
// arrive within ServerOptions.RequestTimeout (30 s) of its first byte,
// and its answer must leave within as long, or the connection is dropped;
// a connection idle between requests is kept. The server's memory for a
// key or value grows as its bytes arrive, so a length announced and never
// sent costs nothing.
//
// # Who may talk to the store
//
// Like PyTorch's TCPStore, the store has no authentication by default:
// anyone who can reach MASTER_ADDR:MASTER_PORT can read and write it, and
// could give the ranks a NCCL unique id of their own. (Rank 0 listens on
// MASTER_ADDR only, not on every interface as TCPStore does; 127.0.0.1
// keeps a one-machine job on this machine.)
//
// Options.Secret (or, when it is empty, the variable DDPGO_STORE_SECRET,
// SecretEnv, which a launcher exports to every rank) sets a job secret.
// Each connection then begins with a handshake in which the client and the
// server prove to each other that they know the secret (HMAC-SHA256 over
// nonces of both; the secret itself never travels), and the server serves
// no request on a connection that has not: another job, a stray client or
// a scanner can no longer read or set a key such as ddpgo/nccl/unique-id,
// and a rank refuses a server that does not know the secret (another
// process listening on the port first). Use a long random secret, for
// example from openssl rand -hex 32.
//
// What the secret does not protect: the traffic is plain TCP, so anyone
// who can watch the network between the ranks reads the values (the NCCL
// unique id among them), and anyone who can change it in transit can take
// over a connection once it is authenticated; use a private network, or a
// tunnel, for that. The secret is as safe as the environment it is in
// (/proc/<pid>/environ is readable by the job's user and root). Without a
// secret anyone can greet, so the limits above bind only connections that
// do not: a client that greets on many connections and then idles holds a
// descriptor and a goroutine on each.
//
// # Protocol
//
// One request at a time per connection, each a frame
//
//	op (1 byte) | key length (4 bytes, big endian) | key | value length (4) | value | wait (8, nanoseconds)
//
// answered by
//
//	status (1 byte) | value length (4) | value
//
// where a status other than 0 carries an error message as its value (3:
// the secret is missing or wrong). Get and Wait are held by the server
// until the keys exist or the wait the client sent has passed; the client
// also bounds the connection with the same deadline, so a server that has
// died cannot hold it. A connection's first request is the greeting,
// Hello (op 5) with an empty key. Without a secret its value is empty, and
// so is the answer. With one, its value is the client's 32-byte nonce,
// answered by the server's nonce and its proof, HMAC(secret, "ddpgo
// rendezvous server" | client nonce | server nonce); then Auth (op 6)
// whose value is the client's proof, the same with "client". The server
// serves nothing else before.
package rendezvous
