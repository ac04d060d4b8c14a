package s3server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/weirstream/weir/internal/s3server"
)

func TestServerServesS3AndClosesTwice(t *testing.T) {
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.Endpoint()+"/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<Name>weir</Name>") {
		t.Errorf("list buckets: %d %s; want bucket weir", resp.StatusCode, body)
	}
	if got := srv.URL("weir", "p"); got != "s3://weir/p?endpoint=http://"+srv.Addr() {
		t.Errorf("URL = %s", got)
	}
	http.DefaultClient.CloseIdleConnections()
	if err := srv.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}
