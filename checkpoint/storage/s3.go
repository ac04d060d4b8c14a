package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// s3Store keeps objects in an S3 bucket under a prefix. Bodies are read in
// parts of cfg.partSize: one part is one PutObject (seekable, as the SDK
// needs over plain HTTP), more are a multipart upload, aborted on failure.
type s3Store struct {
	client   *s3.Client
	bucket   string
	prefix   string // "" or ending in "/"
	partSize int64
}

func openS3(ctx context.Context, u *url.URL, c cfg) (Storage, error) {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrBadURL, u.String(), why) }
	if u.Host == "" {
		return nil, bad("no bucket (s3://bucket/prefix)")
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path-style":
		default:
			return nil, bad(fmt.Sprintf("unknown parameter %q (endpoint, region, path-style)", k))
		}
	}
	endpoint := q.Get("endpoint")
	if endpoint != "" {
		eu, err := url.Parse(endpoint)
		if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
			return nil, bad(fmt.Sprintf("endpoint %q is not an http(s) URL", endpoint))
		}
	}
	pathStyle := endpoint != ""
	if v := q.Get("path-style"); v != "" {
		switch v {
		case "true":
			pathStyle = true
		case "false":
			pathStyle = false
		default:
			return nil, bad(fmt.Sprintf("path-style=%q: want true or false", v))
		}
	}
	region := q.Get("region")
	if region == "" {
		region = "us-east-1"
	}
	loadOpts := []func(*config.LoadOptions) error{config.WithRegion(region)}
	if c.accessKey != "" {
		loadOpts = append(loadOpts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.accessKey, c.secretKey, "")))
	}
	if c.httpClient != nil {
		loadOpts = append(loadOpts, config.WithHTTPClient(c.httpClient))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint storage %s: AWS configuration: %w", u.String(), err)
	}
	if c.accessKey == "" && loopback(endpoint) {
		awsCfg.Credentials = loopbackCredentials{awsCfg.Credentials}
	}
	// S3-compatible stores other than AWS reject or mishandle the SDK's
	// default request checksums: compute them only when an API requires.
	awsCfg.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
	awsCfg.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.UsePathStyle = pathStyle
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	})
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := checkKey(prefix); err != nil {
			return nil, bad("the prefix " + err.Error())
		}
		prefix += "/"
	}
	return &s3Store{client: client, bucket: u.Host, prefix: prefix, partSize: c.partSize}, nil
}

// loopback reports whether endpoint is an http(s) URL on this machine's
// loopback interface (the embedded S3 server `streamctl local` prints).
func loopback(endpoint string) bool {
	eu, err := url.Parse(endpoint)
	if err != nil || eu.Host == "" {
		return false
	}
	host := eu.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackCredentials are the standard AWS credentials, or, when there
// are none, placeholder ones: an S3 endpoint on loopback is a development
// store (the embedded S3 server, which checks no signature), and its URLs,
// as `streamctl local` prints them, then work without AWS configuration. A
// store there that checks signatures refuses them, naming the access key.
type loopbackCredentials struct{ aws.CredentialsProvider }

func (l loopbackCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	if l.CredentialsProvider != nil {
		if c, err := l.CredentialsProvider.Retrieve(ctx); err == nil {
			return c, nil
		}
	}
	return aws.Credentials{AccessKeyID: "weir-loopback", SecretAccessKey: "weir-loopback", Source: "weir: loopback endpoint without AWS credentials"}, nil
}

// s3Err maps S3's answers onto the package's errors.
func s3Err(op, key string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
		case "PreconditionFailed", "ConditionalRequestConflict":
			return fmt.Errorf("%s %s: %w", op, key, ErrExists)
		case "InvalidRange":
			return fmt.Errorf("%s %s: %w", op, key, ErrBeyondEnd)
		}
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func (s *s3Store) Put(ctx context.Context, key string, body io.Reader) error {
	if err := checkKey(key); err != nil {
		return err
	}
	first, err := readPart(body, s.partSize)
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	if int64(len(first)) < s.partSize {
		return s.putOnce(ctx, key, first, false)
	}
	return s.putMultipart(ctx, key, first, body)
}

func (s *s3Store) Create(ctx context.Context, key string, body io.Reader) error {
	if err := checkKey(key); err != nil {
		return err
	}
	// One PUT with If-None-Match: * is S3's create-if-absent. Objects
	// created this way (checkpoint metadata) are small; they are read
	// whole into memory.
	b, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("create %s: %w", key, err)
	}
	return s.putOnce(ctx, key, b, true)
}

func (s *s3Store) putOnce(ctx context.Context, key string, b []byte, create bool) error {
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.prefix + key),
		Body:          bytes.NewReader(b),
		ContentLength: aws.Int64(int64(len(b))),
	}
	op := "write"
	if create {
		in.IfNoneMatch = aws.String("*")
		op = "create"
	}
	if _, err := s.client.PutObject(ctx, in); err != nil {
		return s3Err(op, key, err)
	}
	return nil
}

func (s *s3Store) putMultipart(ctx context.Context, key string, first []byte, rest io.Reader) (err error) {
	full := s.prefix + key
	up, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(s.bucket), Key: aws.String(full)})
	if err != nil {
		return s3Err("write", key, err)
	}
	defer func() {
		if err != nil {
			// Abort even when ctx is done, so no parts linger.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: aws.String(s.bucket), Key: aws.String(full), UploadId: up.UploadId})
		}
	}()
	var parts []s3types.CompletedPart
	part := first
	for n := int32(1); len(part) > 0; n++ {
		out, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: aws.String(s.bucket), Key: aws.String(full), UploadId: up.UploadId,
			PartNumber: aws.Int32(n), Body: bytes.NewReader(part), ContentLength: aws.Int64(int64(len(part))),
		})
		if err != nil {
			return s3Err(fmt.Sprintf("write part %d of", n), key, err)
		}
		parts = append(parts, s3types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n)})
		if int64(len(part)) < s.partSize {
			break
		}
		if part, err = readPart(rest, s.partSize); err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
	}
	_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: aws.String(s.bucket), Key: aws.String(full), UploadId: up.UploadId,
		MultipartUpload: &s3types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		return s3Err("write", key, err)
	}
	return nil
}

// readPart reads up to n bytes of r; fewer means r is at its end.
func readPart(r io.Reader, n int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, n))
	return b, err
}

func (s *s3Store) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if n == 0 {
		head, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)})
		if err != nil {
			return nil, s3Err("read", key, err)
		}
		if off > aws.ToInt64(head.ContentLength) {
			return nil, fmt.Errorf("read %s at %d: %w", key, off, ErrBeyondEnd)
		}
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	in := &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)}
	switch {
	case n > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	case off > 0:
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", off))
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		var ae smithy.APIError
		if off > 0 && errors.As(err, &ae) && ae.ErrorCode() == "InvalidRange" {
			// S3 refuses a range starting at the end of the object; the
			// other stores give an empty read there.
			if head, herr := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)}); herr == nil && aws.ToInt64(head.ContentLength) == off {
				return io.NopCloser(bytes.NewReader(nil)), nil
			}
		}
		return nil, s3Err("read", key, err)
	}
	return out.Body, nil
}

func (s *s3Store) List(ctx context.Context, prefix string, fn func(Object) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix + prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s3Err("list", prefix, err)
		}
		for _, o := range page.Contents {
			if err := fn(Object{Key: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), Size: aws.ToInt64(o.Size), Modified: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *s3Store) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + key)}); err != nil {
		if errors.Is(s3Err("delete", key, err), ErrNotFound) {
			return nil
		}
		return s3Err("delete", key, err)
	}
	return nil
}

func (s *s3Store) Close() error { return nil }
