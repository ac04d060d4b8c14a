package cli

import (
	"crypto/tls"

	"github.com/spf13/cobra"

	"github.com/weirstream/weir/internal/rpc"
)

// accessFlags are how a task manager or a client command reaches a job
// manager that requires a token or serves TLS.
type accessFlags struct {
	tokenFile string
	tlsCA     string
	tls       bool
}

func (f *accessFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.tokenFile, "auth-token-file", "", "file holding the job manager's auth token")
	cmd.Flags().BoolVar(&f.tls, "tls", false, "reach the job manager over TLS (trusting the system's CAs, or --tls-ca)")
	cmd.Flags().StringVar(&f.tlsCA, "tls-ca", "", "PEM file of the CA that signed the job manager's certificate (implies --tls)")
}

// tlsOn reports whether the flags ask for TLS.
func (f *accessFlags) tlsOn() bool { return f.tls || f.tlsCA != "" }

// load reads the token ("" without --auth-token-file) and the TLS
// configuration (nil without --tls or --tls-ca).
func (f *accessFlags) load() (token string, cfg *tls.Config, err error) {
	if f.tokenFile != "" {
		if token, err = rpc.ReadToken(f.tokenFile); err != nil {
			return "", nil, err
		}
	}
	if f.tlsOn() {
		if cfg, err = rpc.ClientTLS(f.tlsCA); err != nil {
			return "", nil, err
		}
	}
	return token, cfg, nil
}

// dialOpts turns the flags into rpc.Dial options.
func (f *accessFlags) dialOpts() ([]rpc.DialOpt, error) {
	token, cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	opts := []rpc.DialOpt{rpc.WithToken(token)}
	if cfg != nil {
		opts = append(opts, rpc.WithTLS(cfg))
	}
	return opts, nil
}
