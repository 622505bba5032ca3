package envoyconfigs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The SDS secrets of Envoy's credential for the control plane, and the
// files (in XDSAuth.SDSDir) that serve them.
const (
	sdsCertName = "inferlb_xds_client"
	sdsCAName   = "inferlb_xds_ca"
	sdsCertFile = "xds-client-cert.yaml"
	sdsCAFile   = "xds-ca.yaml"
)

// SDSCertName and the others name the SDS secrets and resource files in
// the template.
func (d data) SDSCertName() string { return sdsCertName }
func (d data) SDSCAName() string   { return sdsCAName }
func (d data) SDSCertPath() string { return filepath.Join(d.XDSAuth.SDSDir, sdsCertFile) }
func (d data) SDSCAPath() string   { return filepath.Join(d.XDSAuth.SDSDir, sdsCAFile) }

// SDSFiles are the SDS resource files a bootstrap with a.SDSDir names:
// file name (in a.SDSDir) → content. Each is a DiscoveryResponse holding
// one Secret that names the credential files (not their content) and
// watches their directory: a change there, a renamed file or a
// Kubernetes Secret volume's symlink swap, makes Envoy read the files
// again, certificate and key together. The content does not change when
// the credentials do, so a Kubernetes ConfigMap can hold these files.
func SDSFiles(a XDSAuth) map[string]string {
	out := map[string]string{}
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	if a.CertFile != "" {
		out[sdsCertFile] = strings.Join([]string{
			"# Envoy's client certificate for the control plane (SDS; see docs/operations.md).",
			"resources:",
			`- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret`,
			"  name: " + sdsCertName,
			"  tls_certificate:",
			"    certificate_chain: { filename: " + q(a.CertFile) + " }",
			"    private_key: { filename: " + q(a.KeyFile) + " }",
			"    watched_directory: { path: " + q(filepath.Dir(a.CertFile)) + " }",
			""}, "\n")
	}
	out[sdsCAFile] = strings.Join([]string{
		"# The CA Envoy verifies the control plane's certificate with (SDS; see docs/operations.md).",
		"resources:",
		`- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret`,
		"  name: " + sdsCAName,
		"  validation_context:",
		"    trusted_ca: { filename: " + q(a.CAFile) + " }",
		"    watched_directory: { path: " + q(filepath.Dir(a.CAFile)) + " }",
		""}, "\n")
	return out
}

// WriteSDS writes SDSFiles(a) into a.SDSDir (created if missing).
func WriteSDS(a XDSAuth) error {
	if a.SDSDir == "" {
		return fmt.Errorf("envoyconfigs: WriteSDS: no SDSDir")
	}
	if err := a.check(); err != nil {
		return err
	}
	if err := os.MkdirAll(a.SDSDir, 0o755); err != nil {
		return err
	}
	for name, content := range SDSFiles(a) {
		// Written aside and renamed: Envoy watches the directory and must
		// never read half a file.
		tmp := filepath.Join(a.SDSDir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(a.SDSDir, name)); err != nil {
			return err
		}
	}
	return nil
}
