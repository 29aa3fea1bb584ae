module github.com/fencekv/fencekv

go 1.26

require (
	github.com/HdrHistogram/hdrhistogram-go v1.1.2
	github.com/anishathalye/porcupine v1.3.1
	github.com/urfave/cli/v2 v2.27.7
	github.com/vmihailenco/msgpack/v5 v5.4.1
	go.etcd.io/bbolt v1.5.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/cpuguy83/go-md2man/v2 v2.0.7 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
	golang.org/x/sys v0.45.0 // indirect
)
