package storage

import "net/http"

// Opt configures Open.
type Opt interface{ apply(*cfg) }

type cfg struct {
	partSize   int64
	accessKey  string
	secretKey  string
	httpClient *http.Client
	// beneath confines a file:// store (Beneath; "": not confined).
	beneath string
}

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

// minPartSize is S3's least part size of a multipart upload but the last.
const minPartSize = 5 << 20

func defaultCfg() cfg { return cfg{partSize: 8 << 20} }

// PartSize sets the size of the parts of an S3 multipart upload, by default
// 8 MiB; values below S3's least part size (5 MiB) are raised to it. A body
// of at most one part is written with one PUT. Each upload buffers one part
// in memory.
func PartSize(n int64) Opt {
	return opt(func(c *cfg) { c.partSize = max(n, minPartSize) })
}

// Credentials sets static S3 credentials instead of the standard AWS chain
// (environment, shared files, instance roles): for the embedded S3 server
// and tests.
func Credentials(accessKey, secretKey string) Opt {
	return opt(func(c *cfg) { c.accessKey, c.secretKey = accessKey, secretKey })
}

// HTTPClient sets the HTTP client of S3 requests (by default the AWS SDK's).
func HTTPClient(hc *http.Client) Opt {
	return opt(func(c *cfg) { c.httpClient = hc })
}
