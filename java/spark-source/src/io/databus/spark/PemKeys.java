package io.databus.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;

/**
 * A client certificate and its private key from PEM files, as Python's
 * {@code ssl.SSLContext.load_cert_chain} takes them: a certificate chain, and a key in
 * PKCS#8 ({@code BEGIN PRIVATE KEY}), SEC1 ({@code BEGIN EC PRIVATE KEY}) or PKCS#1
 * ({@code BEGIN RSA PRIVATE KEY}), unencrypted. The JDK reads only PKCS#8, so the other two
 * are wrapped into PKCS#8 here (their DER is the PKCS#8 structure's inner key). Spark's jars
 * hold no PEM reader (no BouncyCastle), hence this class.
 */
final class PemKeys {
    private static final Pattern BLOCK =
        Pattern.compile("-----BEGIN ([A-Z ]+)-----([A-Za-z0-9+/=\\s]+)-----END \\1-----");
    private static final byte[] OID_EC = {0x06, 0x07, 0x2a, (byte) 0x86, 0x48, (byte) 0xce, 0x3d, 0x02, 0x01};
    private static final byte[] OID_RSA =
        {0x06, 0x09, 0x2a, (byte) 0x86, 0x48, (byte) 0x86, (byte) 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00};

    private PemKeys() {}

    /** Key managers presenting {@code certFile}'s chain with {@code keyFile}'s key. */
    static KeyManager[] keyManagers(String certFile, String keyFile) throws IOException, GeneralSecurityException {
        List<Certificate> chain = new ArrayList<>();
        try (InputStream in = Files.newInputStream(Path.of(certFile))) {
            chain.addAll(CertificateFactory.getInstance("X.509").generateCertificates(in));
        }
        if (chain.isEmpty()) {
            throw new GeneralSecurityException("no certificate in " + certFile);
        }
        PrivateKey key = privateKey(Files.readString(Path.of(keyFile), StandardCharsets.US_ASCII), keyFile);
        KeyStore ks = KeyStore.getInstance("PKCS12");
        ks.load(null, null);
        char[] none = new char[0];
        ks.setKeyEntry("client", key, none, chain.toArray(new Certificate[0]));
        KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(ks, none);
        return kmf.getKeyManagers();
    }

    static PrivateKey privateKey(String pem, String where) throws GeneralSecurityException {
        Matcher m = BLOCK.matcher(pem);
        while (m.find()) {
            String kind = m.group(1);
            byte[] der = Base64.getMimeDecoder().decode(m.group(2));
            switch (kind) {
                case "PRIVATE KEY":
                    return anyAlgorithm(der);
                case "EC PRIVATE KEY":
                    return KeyFactory.getInstance("EC").generatePrivate(new PKCS8EncodedKeySpec(
                        pkcs8(seq(OID_EC, curve(der)), der)));
                case "RSA PRIVATE KEY":
                    return KeyFactory.getInstance("RSA").generatePrivate(new PKCS8EncodedKeySpec(
                        pkcs8(seq(OID_RSA), der)));
                default:
                    // another block (a certificate in the same file): look further
            }
        }
        throw new GeneralSecurityException("no unencrypted private key (PRIVATE KEY, EC PRIVATE KEY or "
            + "RSA PRIVATE KEY) in " + where);
    }

    private static PrivateKey anyAlgorithm(byte[] der) throws GeneralSecurityException {
        GeneralSecurityException last = null;
        for (String alg : new String[] {"EC", "RSA", "Ed25519", "Ed448"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(der));
            } catch (GeneralSecurityException e) {
                last = e;
            }
        }
        throw last;
    }

    /** The curve OID ([0] parameters) of a SEC1 ECPrivateKey. */
    private static byte[] curve(byte[] sec1) throws GeneralSecurityException {
        int[] p = {0};
        expect(sec1, p, 0x30);
        length(sec1, p);
        while (p[0] < sec1.length) {
            int tag = sec1[p[0]++] & 0xff;
            int len = length(sec1, p);
            if (tag == 0xa0) {
                byte[] oid = new byte[len];
                System.arraycopy(sec1, p[0], oid, 0, len);
                return oid;
            }
            p[0] += len;
        }
        throw new GeneralSecurityException("an EC private key without its curve (SEC1 parameters)");
    }

    private static void expect(byte[] b, int[] p, int tag) throws GeneralSecurityException {
        if (p[0] >= b.length || (b[p[0]++] & 0xff) != tag) {
            throw new GeneralSecurityException("not a DER private key");
        }
    }

    private static int length(byte[] b, int[] p) throws GeneralSecurityException {
        if (p[0] >= b.length) {
            throw new GeneralSecurityException("truncated DER private key");
        }
        int first = b[p[0]++] & 0xff;
        if (first < 0x80) {
            return first;
        }
        int n = first & 0x7f;
        if (n > 3 || p[0] + n > b.length) {
            throw new GeneralSecurityException("bad DER length");
        }
        int len = 0;
        for (int i = 0; i < n; i++) {
            len = len << 8 | (b[p[0]++] & 0xff);
        }
        return len;
    }

    /** PrivateKeyInfo: version 0, the algorithm, the key's DER as an OCTET STRING. */
    private static byte[] pkcs8(byte[] algorithm, byte[] key) {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        body.writeBytes(new byte[] {0x02, 0x01, 0x00});
        body.writeBytes(algorithm);
        body.writeBytes(tlv(0x04, key));
        return tlv(0x30, body.toByteArray());
    }

    private static byte[] seq(byte[]... parts) {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        for (byte[] part : parts) {
            body.writeBytes(part);
        }
        return tlv(0x30, body.toByteArray());
    }

    private static byte[] tlv(int tag, byte[] value) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(tag);
        int n = value.length;
        if (n < 0x80) {
            out.write(n);
        } else if (n < 0x100) {
            out.write(0x81);
            out.write(n);
        } else if (n < 0x10000) {
            out.write(0x82);
            out.write(n >> 8);
            out.write(n);
        } else {
            out.write(0x83);
            out.write(n >> 16);
            out.write(n >> 8);
            out.write(n);
        }
        out.writeBytes(value);
        return out.toByteArray();
    }
}
