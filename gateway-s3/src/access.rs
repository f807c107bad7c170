//! Who may do what: canned ACLs, Bucket Ownership Controls and bucket
//! policies, evaluated in one place — [`decide`], a pure function of
//! (principal, action, resource, ACL, ownership, policy). The I/O (finding
//! the bucket's owner, reading its `user.s3.access` xattr, an object's ACL
//! from its `user.s3.meta` record) is `crate::auth::Access`, which calls
//! [`decide`] once per request before s3s runs the handler.
//!
//! The decision (first row that applies wins):
//!
//! | # | condition | decision |
//! |---|---|---|
//! | 1 | the principal's tenant owns the bucket and the action is Get/Put/DeleteBucketPolicy | Allow (the owner cannot lock itself out, as AWS keeps the owning account's root) |
//! | 2 | a policy statement with `"Effect": "Deny"` matches principal, action and resource | **Deny** (explicit Deny wins over everything below) |
//! | 3 | the principal's tenant owns the bucket | Allow |
//! | 4 | a policy statement with `"Effect": "Allow"` matches | Allow |
//! | 5 | ownership is `BucketOwnerEnforced` | Deny (ACLs are disabled and grant nothing) |
//! | 6 | the ACL of the resource (object ACL for object reads and ACL ops, bucket ACL for listing and writes) grants the permission the action needs to a group the principal is in | Allow |
//! | 7 | otherwise | Deny (implicit) |
//!
//! Groups: `AllUsers` is everyone, anonymous included; `AuthenticatedUsers`
//! is every signed principal of any tenant. Canned ACLs and their grants
//! (besides the owner's FULL_CONTROL):
//!
//! | canned ACL | bucket | object |
//! |---|---|---|
//! | `private` (default), `bucket-owner-full-control`, `bucket-owner-read` | — | — |
//! | `public-read` | AllUsers READ | AllUsers READ |
//! | `public-read-write` | AllUsers READ, WRITE | AllUsers READ, WRITE |
//! | `authenticated-read` | AuthenticatedUsers READ | AuthenticatedUsers READ |
//!
//! The permission an action needs from an ACL ([`Action::acl_permission`]):
//! object READ for GetObject/HeadObject, object READ_ACP/WRITE_ACP for
//! Get/PutObjectAcl, bucket READ for listing (objects and versions), bucket
//! WRITE for PutObject (and multipart) and DeleteObject, bucket
//! READ_ACP/WRITE_ACP for Get/PutBucketAcl; every other action is the
//! owner's or a policy's. A request naming a version (`versionId`) is its
//! version action ([`Action::of_request`]: `s3:GetObjectVersion`,
//! `s3:DeleteObjectVersion`, `s3:Get/PutObjectVersionAcl`,
//! `s3:Get/Put/DeleteObjectVersionTagging`,
//! `s3:GetObjectVersionAttributes`), checked against that version's ACL.
//!
//! Policy statements: `Effect` Allow|Deny; `Principal` `"*"`, `{"AWS": "*"}`
//! or `{"AWS": [..]}` naming tenants (`"TENANT"`,
//! `"arn:aws:iam::TENANT:root"`) or users (`"arn:aws:iam::TENANT:user/USER"`);
//! `Action` `s3:…` names with `*`/`?` wildcards; `Resource`
//! `arn:aws:s3:::BUCKET` or `arn:aws:s3:::BUCKET/PATTERN` with wildcards, in
//! this bucket. `NotPrincipal`, `NotAction`, `NotResource` and `Condition`
//! are refused when the policy is put (`MalformedPolicy`), never ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who sends a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Anonymous,
    /// A signed request of a gateway user.
    User {
        tenant: String,
        user: String,
    },
}

/// An ACL permission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    Read,
    Write,
    ReadAcp,
    WriteAcp,
}

/// Where an action needs its ACL permission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclTarget {
    Bucket,
    Object,
}

/// A canned ACL (the only ACLs kept: an XML grant list is accepted when it
/// expresses one of these).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CannedAcl {
    #[default]
    Private,
    PublicRead,
    PublicReadWrite,
    AuthenticatedRead,
    BucketOwnerRead,
    BucketOwnerFullControl,
}

/// The grantee groups of an ACL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    AllUsers,
    AuthenticatedUsers,
}

pub const ALL_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
pub const AUTHENTICATED_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";

impl CannedAcl {
    pub const ALL: [CannedAcl; 6] = [
        CannedAcl::Private,
        CannedAcl::PublicRead,
        CannedAcl::PublicReadWrite,
        CannedAcl::AuthenticatedRead,
        CannedAcl::BucketOwnerRead,
        CannedAcl::BucketOwnerFullControl,
    ];

    pub fn parse(s: &str) -> Option<CannedAcl> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CannedAcl::Private => "private",
            CannedAcl::PublicRead => "public-read",
            CannedAcl::PublicReadWrite => "public-read-write",
            CannedAcl::AuthenticatedRead => "authenticated-read",
            CannedAcl::BucketOwnerRead => "bucket-owner-read",
            CannedAcl::BucketOwnerFullControl => "bucket-owner-full-control",
        }
    }

    /// The group grants besides the owner's FULL_CONTROL, sorted.
    pub fn grants(self) -> Vec<(Group, Permission)> {
        match self {
            CannedAcl::Private | CannedAcl::BucketOwnerRead | CannedAcl::BucketOwnerFullControl => vec![],
            CannedAcl::PublicRead => vec![(Group::AllUsers, Permission::Read)],
            CannedAcl::PublicReadWrite => vec![(Group::AllUsers, Permission::Read), (Group::AllUsers, Permission::Write)],
            CannedAcl::AuthenticatedRead => vec![(Group::AuthenticatedUsers, Permission::Read)],
        }
    }

    /// The canned ACL whose group grants are exactly `grants` (the owner's
    /// FULL_CONTROL aside); `None` when no canned ACL expresses them.
    pub fn from_grants(grants: &[(Group, Permission)]) -> Option<CannedAcl> {
        let mut g = grants.to_vec();
        g.sort();
        g.dedup();
        [CannedAcl::Private, CannedAcl::PublicRead, CannedAcl::PublicReadWrite, CannedAcl::AuthenticatedRead]
            .into_iter()
            .find(|a| a.grants() == g)
    }

    /// Whether the ACL lets `principal` (not the owner) have `perm`.
    pub fn allows(self, principal: &Principal, perm: Permission) -> bool {
        self.grants().iter().any(|(group, p)| {
            *p == perm
                && match group {
                    Group::AllUsers => true,
                    Group::AuthenticatedUsers => matches!(principal, Principal::User { .. }),
                }
        })
    }

    /// Whether Bucket Ownership Controls `BucketOwnerEnforced` accepts this
    /// ACL on a request (AWS: only `bucket-owner-full-control` and
    /// `private`, the ACLs that change nothing).
    pub fn allowed_when_enforced(self) -> bool {
        matches!(self, CannedAcl::Private | CannedAcl::BucketOwnerFullControl)
    }
}

/// Bucket Ownership Controls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ownership {
    /// The default here (objects are always the bucket owner's; ACLs count).
    #[default]
    ObjectWriter,
    BucketOwnerPreferred,
    /// ACLs are disabled: they grant nothing, and requests setting any ACL
    /// but `private`/`bucket-owner-full-control` fail with
    /// `AccessControlListNotSupported`.
    BucketOwnerEnforced,
}

impl Ownership {
    pub fn parse(s: &str) -> Option<Ownership> {
        match s {
            "ObjectWriter" => Some(Ownership::ObjectWriter),
            "BucketOwnerPreferred" => Some(Ownership::BucketOwnerPreferred),
            "BucketOwnerEnforced" => Some(Ownership::BucketOwnerEnforced),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Ownership::ObjectWriter => "ObjectWriter",
            Ownership::BucketOwnerPreferred => "BucketOwnerPreferred",
            Ownership::BucketOwnerEnforced => "BucketOwnerEnforced",
        }
    }
}

/// What the bucket directory's `user.s3.access` xattr keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketAccess {
    #[serde(default)]
    pub acl: CannedAcl,
    /// `None`: no ownership controls were put (GetBucketOwnershipControls
    /// answers `OwnershipControlsNotFoundError`); acts as `ObjectWriter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ownership: Option<Ownership>,
    /// The policy as the client sent it (GetBucketPolicy returns it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_json: Option<String>,
    #[serde(skip)]
    pub policy: Option<Policy>,
}

impl BucketAccess {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The stored record; an unreadable one is treated as private with no
    /// policy (the owner can always put a new one).
    pub fn decode(bytes: &[u8]) -> BucketAccess {
        let mut a: BucketAccess = match serde_json::from_slice(bytes) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable bucket access record; treating the bucket as private");
                return BucketAccess::default();
            }
        };
        a.policy = a.policy_json.as_deref().and_then(|j| Policy::parse(j, None).ok());
        a
    }

    pub fn ownership(&self) -> Ownership {
        self.ownership.unwrap_or_default()
    }
}

/// An S3 action as policies name it (`s3:GetObject`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    pub name: &'static str,
    /// Whether the action needs the owner or a policy (`None`) or can be
    /// granted by an ACL permission on the bucket or the object.
    pub acl: Option<(AclTarget, Permission)>,
}

impl Action {
    /// The action of an S3 operation (s3s's operation names).
    pub fn of_operation(op: &str) -> Action {
        use AclTarget::{Bucket, Object};
        use Permission::*;
        let (name, acl) = match op {
            "GetObject" | "HeadObject" | "GetObjectAttributes" => ("s3:GetObject", Some((Object, Read))),
            "PutObject" | "CopyObject" | "CreateMultipartUpload" | "UploadPart" | "UploadPartCopy" | "CompleteMultipartUpload" => {
                ("s3:PutObject", Some((Bucket, Write)))
            }
            "AbortMultipartUpload" => ("s3:AbortMultipartUpload", Some((Bucket, Write))),
            "DeleteObject" | "DeleteObjects" => ("s3:DeleteObject", Some((Bucket, Write))),
            "ListObjects" | "ListObjectsV2" | "HeadBucket" => ("s3:ListBucket", Some((Bucket, Read))),
            "ListObjectVersions" => ("s3:ListBucketVersions", Some((Bucket, Read))),
            "ListMultipartUploads" => ("s3:ListBucketMultipartUploads", Some((Bucket, Read))),
            "ListParts" => ("s3:ListMultipartUploadParts", Some((Bucket, Write))),
            "GetObjectAcl" => ("s3:GetObjectAcl", Some((Object, ReadAcp))),
            "PutObjectAcl" => ("s3:PutObjectAcl", Some((Object, WriteAcp))),
            "GetBucketAcl" => ("s3:GetBucketAcl", Some((Bucket, ReadAcp))),
            "PutBucketAcl" => ("s3:PutBucketAcl", Some((Bucket, WriteAcp))),
            "GetObjectTagging" => ("s3:GetObjectTagging", None),
            "PutObjectTagging" => ("s3:PutObjectTagging", None),
            "DeleteObjectTagging" => ("s3:DeleteObjectTagging", None),
            "GetBucketPolicy" => ("s3:GetBucketPolicy", None),
            "PutBucketPolicy" => ("s3:PutBucketPolicy", None),
            "DeleteBucketPolicy" => ("s3:DeleteBucketPolicy", None),
            "GetBucketCors" => ("s3:GetBucketCORS", None),
            "PutBucketCors" | "DeleteBucketCors" => ("s3:PutBucketCORS", None),
            "GetBucketLifecycleConfiguration" => ("s3:GetLifecycleConfiguration", None),
            "PutBucketLifecycleConfiguration" | "DeleteBucketLifecycle" => ("s3:PutLifecycleConfiguration", None),
            "GetBucketOwnershipControls" => ("s3:GetBucketOwnershipControls", None),
            "PutBucketOwnershipControls" | "DeleteBucketOwnershipControls" => ("s3:PutBucketOwnershipControls", None),
            "GetBucketLocation" => ("s3:GetBucketLocation", None),
            "DeleteBucket" => ("s3:DeleteBucket", None),
            "GetBucketVersioning" => ("s3:GetBucketVersioning", None),
            "PutBucketVersioning" => ("s3:PutBucketVersioning", None),
            // Anything else is the owner's alone (no policy names it).
            _ => ("s3:OwnerOnly", None),
        };
        Action { name, acl }
    }

    /// The action of a request: [`Action::of_operation`], except that an
    /// object operation naming a version (`versionId`) is its version
    /// action, as AWS names them (`s3:GetObject` → `s3:GetObjectVersion`,
    /// …); the ACL permission it needs is the same, from that version's ACL.
    pub fn of_request(op: &str, names_version: bool) -> Action {
        let a = Action::of_operation(op);
        if !names_version {
            return a;
        }
        let name = match (op, a.name) {
            ("GetObjectAttributes", _) => "s3:GetObjectVersionAttributes",
            (_, "s3:GetObject") => "s3:GetObjectVersion",
            ("DeleteObject", _) => "s3:DeleteObjectVersion",
            (_, "s3:GetObjectAcl") => "s3:GetObjectVersionAcl",
            (_, "s3:PutObjectAcl") => "s3:PutObjectVersionAcl",
            (_, "s3:GetObjectTagging") => "s3:GetObjectVersionTagging",
            (_, "s3:PutObjectTagging") => "s3:PutObjectVersionTagging",
            (_, "s3:DeleteObjectTagging") => "s3:DeleteObjectVersionTagging",
            (_, other) => other,
        };
        Action { name, ..a }
    }

    fn manages_policy(&self) -> bool {
        matches!(self.name, "s3:GetBucketPolicy" | "s3:PutBucketPolicy" | "s3:DeleteBucketPolicy")
    }
}

/// What an action is applied to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    Bucket(String),
    Object(String, String),
    /// Some objects of the bucket, named in the body (DeleteObjects): the
    /// up-front check of a batch whose keys are then decided one by one
    /// (`auth::PerKeyAccess`), so it refuses only what no key could pass:
    /// an Allow matches when it could match some object of the bucket, a
    /// Deny only when it matches every object.
    AnyObject(String),
}

impl Resource {
    pub fn bucket(&self) -> &str {
        match self {
            Resource::Bucket(b) | Resource::Object(b, _) | Resource::AnyObject(b) => b,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

/// A policy principal pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrincipalPattern {
    Anyone,
    Tenant(String),
    User { tenant: String, user: String },
}

impl PrincipalPattern {
    fn matches(&self, p: &Principal) -> bool {
        match (self, p) {
            (PrincipalPattern::Anyone, _) => true,
            (PrincipalPattern::Tenant(t), Principal::User { tenant, .. }) => t == tenant,
            (PrincipalPattern::User { tenant: t, user: u }, Principal::User { tenant, user }) => t == tenant && u == user,
            (_, Principal::Anonymous) => false,
        }
    }

    fn parse(s: &str) -> Result<PrincipalPattern, String> {
        if s == "*" {
            return Ok(PrincipalPattern::Anyone);
        }
        if let Some(rest) = s.strip_prefix("arn:aws:iam::") {
            let (tenant, what) =
                rest.split_once(':').ok_or_else(|| format!("principal {s:?} is not arn:aws:iam::TENANT:root|user/NAME"))?;
            if tenant.is_empty() {
                return Err(format!("principal {s:?} names no tenant"));
            }
            return match what {
                "root" => Ok(PrincipalPattern::Tenant(tenant.to_string())),
                _ => match what.strip_prefix("user/") {
                    Some(u) if !u.is_empty() => Ok(PrincipalPattern::User { tenant: tenant.to_string(), user: u.to_string() }),
                    _ => Err(format!("principal {s:?} is not arn:aws:iam::TENANT:root|user/NAME")),
                },
            };
        }
        if s.is_empty() || s.contains(':') || s.contains('*') {
            return Err(format!("principal {s:?} is neither \"*\", a tenant nor an arn:aws:iam:: ARN"));
        }
        Ok(PrincipalPattern::Tenant(s.to_string()))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub effect: Effect,
    pub principals: Vec<PrincipalPattern>,
    pub actions: Vec<String>,
    pub resources: Vec<String>,
}

/// A parsed bucket policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub statements: Vec<Statement>,
}

/// Most bytes of a policy document (AWS: 20 KiB).
pub const MAX_POLICY_BYTES: usize = 20 * 1024;

fn strings(v: &Value, what: &str) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) if !a.is_empty() => {
            a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| format!("{what} must be strings"))).collect()
        }
        _ => Err(format!("{what} must be a string or a non-empty array of strings")),
    }
}

impl Policy {
    /// Parses and validates a policy document; `bucket`: when given, every
    /// resource must be in it (PutBucketPolicy).
    pub fn parse(json: &str, bucket: Option<&str>) -> Result<Policy, String> {
        if json.len() > MAX_POLICY_BYTES {
            return Err(format!("the policy is larger than {MAX_POLICY_BYTES} bytes"));
        }
        let doc: Value = serde_json::from_str(json).map_err(|e| format!("the policy is not JSON: {e}"))?;
        let obj = doc.as_object().ok_or("the policy must be a JSON object")?;
        for k in obj.keys() {
            if !matches!(k.as_str(), "Version" | "Id" | "Statement") {
                return Err(format!("unknown policy element {k:?}"));
            }
        }
        if let Some(v) = obj.get("Version") {
            if !matches!(v.as_str(), Some("2012-10-17" | "2008-10-17")) {
                return Err("Version must be \"2012-10-17\" or \"2008-10-17\"".into());
            }
        }
        let list = match obj.get("Statement") {
            Some(Value::Array(a)) if !a.is_empty() => a.clone(),
            Some(s @ Value::Object(_)) => vec![s.clone()],
            _ => return Err("the policy has no Statement".into()),
        };
        let mut statements = Vec::new();
        for s in &list {
            let s = s.as_object().ok_or("a Statement must be an object")?;
            for k in s.keys() {
                match k.as_str() {
                    "Sid" | "Effect" | "Principal" | "Action" | "Resource" => {}
                    "NotPrincipal" | "NotAction" | "NotResource" | "Condition" => {
                        return Err(format!("{k} is not supported by this gateway"));
                    }
                    _ => return Err(format!("unknown statement element {k:?}")),
                }
            }
            let effect = match s.get("Effect").and_then(Value::as_str) {
                Some("Allow") => Effect::Allow,
                Some("Deny") => Effect::Deny,
                _ => return Err("Effect must be \"Allow\" or \"Deny\"".into()),
            };
            let principals = match s.get("Principal") {
                Some(Value::String(p)) if p == "*" => vec![PrincipalPattern::Anyone],
                Some(Value::Object(m)) => {
                    if m.keys().any(|k| k != "AWS") || m.is_empty() {
                        return Err("Principal supports only \"*\" and {\"AWS\": ...}".into());
                    }
                    strings(&m["AWS"], "Principal.AWS")?.iter().map(|p| PrincipalPattern::parse(p)).collect::<Result<_, _>>()?
                }
                _ => return Err("a Statement needs a Principal (\"*\" or {\"AWS\": ...})".into()),
            };
            let actions = strings(s.get("Action").ok_or("a Statement needs an Action")?, "Action")?;
            for a in &actions {
                if !(a == "*" || a.to_ascii_lowercase().starts_with("s3:")) {
                    return Err(format!("action {a:?} is not an s3: action"));
                }
            }
            let resources = strings(s.get("Resource").ok_or("a Statement needs a Resource")?, "Resource")?;
            for r in &resources {
                let Some(rest) = r.strip_prefix("arn:aws:s3:::") else {
                    return Err(format!("resource {r:?} is not an arn:aws:s3::: ARN"));
                };
                if let Some(b) = bucket {
                    let rb = rest.split('/').next().unwrap_or("");
                    if rb != b {
                        return Err(format!("resource {r:?} is not in bucket {b:?}"));
                    }
                }
            }
            statements.push(Statement { effect, principals, actions, resources });
        }
        Ok(Policy { statements })
    }

    /// The effects of the statements that match, in document order.
    fn matching(&self, principal: &Principal, action: &Action, resource: &Resource) -> (bool, bool) {
        let (mut allow, mut deny) = (false, false);
        for s in &self.statements {
            let p = s.principals.iter().any(|p| p.matches(principal));
            // IAM action names are case-insensitive.
            let a = s.actions.iter().any(|pat| glob(&pat.to_ascii_lowercase(), &action.name.to_ascii_lowercase()));
            if !(p && a) {
                continue;
            }
            let r = match (resource, s.effect) {
                (Resource::Bucket(b), _) => s.resources.iter().any(|pat| glob(pat, &format!("arn:aws:s3:::{b}"))),
                (Resource::Object(b, k), _) => s.resources.iter().any(|pat| glob(pat, &format!("arn:aws:s3:::{b}/{k}"))),
                (Resource::AnyObject(b), Effect::Allow) => s.resources.iter().any(|pat| glob_prefix(pat, &format!("arn:aws:s3:::{b}/"))),
                (Resource::AnyObject(b), Effect::Deny) => {
                    s.resources.iter().any(|pat| pat.ends_with('*') && glob(pat, &format!("arn:aws:s3:::{b}/")))
                }
            };
            if r {
                match s.effect {
                    Effect::Allow => allow = true,
                    Effect::Deny => deny = true,
                }
            }
        }
        (allow, deny)
    }
}

/// `*` (any run, `/` included) and `?` (one character) matching, as IAM does.
pub fn glob(pattern: &str, text: &str) -> bool {
    glob_impl(pattern.as_bytes(), text.as_bytes(), false)
}

/// Whether some text that starts with `prefix` matches `pattern`.
pub fn glob_prefix(pattern: &str, prefix: &str) -> bool {
    glob_impl(pattern.as_bytes(), prefix.as_bytes(), true)
}

fn glob_impl(p: &[u8], t: &[u8], prefix: bool) -> bool {
    // reach[j]: pattern[..i] matches text[..j]; O(|p|·|t|), both bounded
    // (keys 1 KiB, a policy 20 KiB).
    let mut reach = vec![false; t.len() + 1];
    reach[0] = true;
    for &pc in p {
        let mut next = vec![false; t.len() + 1];
        match pc {
            b'*' => {
                let mut any = false;
                for j in 0..=t.len() {
                    any |= reach[j];
                    next[j] = any;
                }
            }
            _ => {
                for j in 0..t.len() {
                    if reach[j] && (pc == b'?' || pc == t[j]) {
                        next[j + 1] = true;
                    }
                }
            }
        }
        if prefix && reach[t.len()] {
            // The whole prefix was matched with pattern left over: some
            // longer text matches it.
            return true;
        }
        reach = next;
    }
    reach[t.len()]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused; `explicit`: by a Deny statement.
    Deny {
        explicit: bool,
    },
}

/// Everything [`decide`] looks at besides the principal, action and resource.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    /// Whether the principal's tenant owns the bucket.
    pub owner: bool,
    pub bucket_acl: CannedAcl,
    /// The object's ACL (object actions on an existing object; `None`
    /// otherwise, which grants nothing).
    pub object_acl: Option<CannedAcl>,
    pub ownership: Ownership,
    pub policy: Option<&'a Policy>,
}

/// The one access decision (the table in the module doc).
pub fn decide(principal: &Principal, action: &Action, resource: &Resource, facts: &Facts<'_>) -> Decision {
    if facts.owner && action.manages_policy() {
        return Decision::Allow;
    }
    let (allow, deny) = facts.policy.map_or((false, false), |p| p.matching(principal, action, resource));
    if deny {
        return Decision::Deny { explicit: true };
    }
    if facts.owner || allow {
        return Decision::Allow;
    }
    if facts.ownership == Ownership::BucketOwnerEnforced {
        return Decision::Deny { explicit: false };
    }
    let granted = match action.acl {
        Some((AclTarget::Bucket, perm)) => facts.bucket_acl.allows(principal, perm),
        Some((AclTarget::Object, perm)) => facts.object_acl.is_some_and(|a| a.allows(principal, perm)),
        None => false,
    };
    if granted {
        Decision::Allow
    } else {
        Decision::Deny { explicit: false }
    }
}

/// Whether [`decide`] may need the object's ACL (so the caller reads it
/// only then): a non-owner's object action that no policy decides and
/// whose ACL permission is on the object.
pub fn needs_object_acl(action: &Action, facts_without_object: &Facts<'_>) -> bool {
    !facts_without_object.owner
        && facts_without_object.ownership != Ownership::BucketOwnerEnforced
        && matches!(action.acl, Some((AclTarget::Object, _)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn user(t: &str, u: &str) -> Principal {
        Principal::User { tenant: t.into(), user: u.into() }
    }

    fn facts(
        owner: bool,
        bucket_acl: CannedAcl,
        object_acl: Option<CannedAcl>,
        ownership: Ownership,
        policy: Option<&Policy>,
    ) -> Facts<'_> {
        Facts { owner, bucket_acl, object_acl, ownership, policy }
    }

    const OPS: [&str; 16] = [
        "GetObject",
        "HeadObject",
        "PutObject",
        "DeleteObject",
        "ListObjectsV2",
        "GetObjectAcl",
        "PutObjectAcl",
        "GetBucketAcl",
        "PutBucketAcl",
        "GetBucketPolicy",
        "PutBucketPolicy",
        "DeleteBucketPolicy",
        "PutBucketCors",
        "GetObjectTagging",
        "CreateMultipartUpload",
        "DeleteBucket",
    ];

    fn resource_of(op: &str) -> Resource {
        match Action::of_operation(op).acl {
            Some((AclTarget::Object, _)) => Resource::Object("b".into(), "k".into()),
            _ if matches!(op, "PutObject" | "DeleteObject" | "CreateMultipartUpload" | "GetObjectTagging") => {
                Resource::Object("b".into(), "k".into())
            }
            _ => Resource::Bucket("b".into()),
        }
    }

    /// The table, spelled out independently of `decide`'s code: the
    /// reference the exhaustive test compares against.
    fn reference(p: &Principal, op: &str, f: &Facts<'_>, policy_allow: bool, policy_deny: bool) -> Decision {
        let policy_op = matches!(op, "GetBucketPolicy" | "PutBucketPolicy" | "DeleteBucketPolicy");
        if f.owner && policy_op {
            return Decision::Allow;
        }
        if policy_deny {
            return Decision::Deny { explicit: true };
        }
        if f.owner || policy_allow {
            return Decision::Allow;
        }
        if f.ownership == Ownership::BucketOwnerEnforced {
            return Decision::Deny { explicit: false };
        }
        let signed = matches!(p, Principal::User { .. });
        let grants = |acl: CannedAcl, perm: &str| match (acl, perm) {
            (CannedAcl::PublicRead, "READ") | (CannedAcl::PublicReadWrite, "READ") | (CannedAcl::PublicReadWrite, "WRITE") => true,
            (CannedAcl::AuthenticatedRead, "READ") => signed,
            _ => false,
        };
        let ok = match op {
            "GetObject" | "HeadObject" => f.object_acl.is_some_and(|a| grants(a, "READ")),
            "ListObjectsV2" => grants(f.bucket_acl, "READ"),
            "PutObject" | "DeleteObject" | "CreateMultipartUpload" => grants(f.bucket_acl, "WRITE"),
            // No canned ACL grants READ_ACP/WRITE_ACP to a group.
            _ => false,
        };
        if ok {
            Decision::Allow
        } else {
            Decision::Deny { explicit: false }
        }
    }

    #[test]
    fn exhaustive_over_principals_actions_acls_ownership_and_policy_effects() {
        let principals = [Principal::Anonymous, user("t1", "alice"), user("t2", "bob")];
        // Policies whose statements match everything with the given effects.
        let allow_all =
            Policy::parse(r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::*"}]}"#, None)
                .unwrap();
        let deny_all =
            Policy::parse(r#"{"Statement":[{"Effect":"Deny","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::*"}]}"#, None)
                .unwrap();
        let both = Policy { statements: [allow_all.statements.clone(), deny_all.statements.clone()].concat() };
        let policies: [(Option<&Policy>, bool, bool); 4] =
            [(None, false, false), (Some(&allow_all), true, false), (Some(&deny_all), false, true), (Some(&both), true, true)];
        let mut n = 0;
        for p in &principals {
            for op in OPS {
                let action = Action::of_operation(op);
                let resource = resource_of(op);
                for owner in [false, true] {
                    if owner && *p == Principal::Anonymous {
                        continue;
                    }
                    for bucket_acl in CannedAcl::ALL {
                        for object_acl in [None, Some(CannedAcl::Private), Some(CannedAcl::PublicRead), Some(CannedAcl::AuthenticatedRead)]
                        {
                            for ownership in [Ownership::ObjectWriter, Ownership::BucketOwnerPreferred, Ownership::BucketOwnerEnforced] {
                                for (policy, pa, pd) in policies {
                                    let f = facts(owner, bucket_acl, object_acl, ownership, policy);
                                    let got = decide(p, &action, &resource, &f);
                                    assert_eq!(
                                        got,
                                        reference(p, op, &f, pa, pd),
                                        "{p:?} {op} owner={owner} {bucket_acl:?} {object_acl:?} {ownership:?} {policy:?}"
                                    );
                                    n += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(n > 10_000, "{n} cases");
    }

    #[test]
    fn anonymous_reads_a_public_read_object_but_not_a_private_one() {
        let get = Action::of_operation("GetObject");
        let obj = Resource::Object("b".into(), "k".into());
        let f = |acl| facts(false, CannedAcl::Private, Some(acl), Ownership::ObjectWriter, None);
        assert_eq!(decide(&Principal::Anonymous, &get, &obj, &f(CannedAcl::PublicRead)), Decision::Allow);
        assert_eq!(decide(&Principal::Anonymous, &get, &obj, &f(CannedAcl::Private)), Decision::Deny { explicit: false });
        assert_eq!(decide(&Principal::Anonymous, &get, &obj, &f(CannedAcl::AuthenticatedRead)), Decision::Deny { explicit: false });
        assert_eq!(decide(&user("x", "y"), &get, &obj, &f(CannedAcl::AuthenticatedRead)), Decision::Allow);
        // A public-read bucket lists for anyone but does not make its objects readable.
        let list = Action::of_operation("ListObjectsV2");
        let bf = facts(false, CannedAcl::PublicRead, None, Ownership::ObjectWriter, None);
        assert_eq!(decide(&Principal::Anonymous, &list, &Resource::Bucket("b".into()), &bf), Decision::Allow);
        assert_eq!(decide(&Principal::Anonymous, &get, &obj, &bf), Decision::Deny { explicit: false });
    }

    #[test]
    fn a_request_naming_a_version_is_its_version_action() {
        let policy = |action: &str| {
            Policy::parse(
                &format!(r#"{{"Statement":[{{"Effect":"Allow","Principal":"*","Action":"{action}","Resource":"arn:aws:s3:::b/*"}}]}}"#),
                Some("b"),
            )
            .unwrap()
        };
        let obj = Resource::Object("b".into(), "k".into());
        let anon = |p: &Policy, op: &str, versioned: bool| {
            let f = facts(false, CannedAcl::Private, Some(CannedAcl::Private), Ownership::ObjectWriter, Some(p));
            decide(&Principal::Anonymous, &Action::of_request(op, versioned), &obj, &f) == Decision::Allow
        };
        let get = policy("s3:GetObject");
        assert!(anon(&get, "GetObject", false) && anon(&get, "HeadObject", false));
        assert!(!anon(&get, "GetObject", true) && !anon(&get, "HeadObject", true));
        let get_version = policy("s3:GetObjectVersion");
        assert!(anon(&get_version, "GetObject", true) && !anon(&get_version, "GetObject", false));
        let both = policy("s3:GetObject*");
        assert!(anon(&both, "GetObject", true) && anon(&both, "GetObject", false));
        for (op, want) in [
            ("DeleteObject", "s3:DeleteObjectVersion"),
            ("GetObjectAcl", "s3:GetObjectVersionAcl"),
            ("PutObjectAcl", "s3:PutObjectVersionAcl"),
            ("GetObjectTagging", "s3:GetObjectVersionTagging"),
            ("PutObjectTagging", "s3:PutObjectVersionTagging"),
            ("DeleteObjectTagging", "s3:DeleteObjectVersionTagging"),
            ("GetObjectAttributes", "s3:GetObjectVersionAttributes"),
            ("PutObject", "s3:PutObject"),
        ] {
            assert_eq!(Action::of_request(op, true).name, want, "{op}");
            assert_eq!(Action::of_request(op, true).acl, Action::of_operation(op).acl, "{op}");
        }
        // Listing versions is granted by the bucket's READ, as listing objects.
        let list = Action::of_operation("ListObjectVersions");
        assert_eq!((list.name, list.acl), ("s3:ListBucketVersions", Some((AclTarget::Bucket, Permission::Read))));
    }

    #[test]
    fn deny_beats_acl_and_allow_and_owner_but_not_policy_management() {
        let policy = Policy::parse(
            r#"{"Version":"2012-10-17","Statement":[
                {"Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":"arn:aws:s3:::b/*"},
                {"Effect":"Deny","Principal":{"AWS":"*"},"Action":"s3:Get*","Resource":"arn:aws:s3:::b/secret/*"},
                {"Effect":"Deny","Principal":{"AWS":["arn:aws:iam::t1:user/alice"]},"Action":"s3:*","Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]}]}"#,
            Some("b"),
        )
        .unwrap();
        let get = Action::of_operation("GetObject");
        let f = facts(false, CannedAcl::PublicRead, Some(CannedAcl::PublicRead), Ownership::ObjectWriter, Some(&policy));
        let public = Resource::Object("b".into(), "pub/x".into());
        let secret = Resource::Object("b".into(), "secret/x".into());
        assert_eq!(decide(&Principal::Anonymous, &get, &public, &f), Decision::Allow);
        assert_eq!(decide(&Principal::Anonymous, &get, &secret, &f), Decision::Deny { explicit: true });
        assert_eq!(decide(&user("t1", "alice"), &get, &public, &f), Decision::Deny { explicit: true });
        assert_eq!(decide(&user("t1", "carol"), &get, &public, &f), Decision::Allow);
        // The owner is denied too (explicit Deny wins) ...
        let owner = facts(true, CannedAcl::Private, None, Ownership::ObjectWriter, Some(&policy));
        assert_eq!(decide(&user("t1", "alice"), &get, &public, &owner), Decision::Deny { explicit: true });
        // ... except for managing the policy itself.
        for op in ["GetBucketPolicy", "PutBucketPolicy", "DeleteBucketPolicy"] {
            assert_eq!(decide(&user("t1", "alice"), &Action::of_operation(op), &Resource::Bucket("b".into()), &owner), Decision::Allow);
        }
    }

    #[test]
    fn enforced_ownership_disables_acls_but_not_policies() {
        let get = Action::of_operation("GetObject");
        let obj = Resource::Object("b".into(), "k".into());
        let f = facts(false, CannedAcl::PublicReadWrite, Some(CannedAcl::PublicRead), Ownership::BucketOwnerEnforced, None);
        assert_eq!(decide(&Principal::Anonymous, &get, &obj, &f), Decision::Deny { explicit: false });
        let allow = Policy::parse(
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            None,
        )
        .unwrap();
        let f = Facts { policy: Some(&allow), ..f };
        assert_eq!(decide(&Principal::Anonymous, &get, &obj, &f), Decision::Allow);
        assert!(CannedAcl::Private.allowed_when_enforced() && CannedAcl::BucketOwnerFullControl.allowed_when_enforced());
        assert!(!CannedAcl::PublicRead.allowed_when_enforced());
    }

    #[test]
    fn a_delete_objects_batch_is_refused_up_front_only_when_no_key_could_pass() {
        let del = Action::of_operation("DeleteObjects");
        let any = Resource::AnyObject("b".into());
        let parse = |effect: &str, resource: &str| {
            Policy::parse(
                &format!(r#"{{"Statement":{{"Effect":"{effect}","Principal":"*","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::{resource}"}}}}"#),
                None,
            )
            .unwrap()
        };
        // A Deny on part of the bucket: the keys outside it may still go
        // (each key is decided again by auth::PerKeyAccess).
        let deny_tmp = parse("Deny", "b/tmp/*");
        let owner = facts(true, CannedAcl::Private, None, Ownership::ObjectWriter, Some(&deny_tmp));
        assert_eq!(decide(&user("t", "u"), &del, &any, &owner), Decision::Allow);
        // A Deny on every object refuses the batch at once.
        let deny_all = parse("Deny", "b/*");
        let owner = facts(true, CannedAcl::Private, None, Ownership::ObjectWriter, Some(&deny_all));
        assert_eq!(decide(&user("t", "u"), &del, &any, &owner), Decision::Deny { explicit: true });
        // An Allow on a prefix lets a non-owner's batch in; keys outside it are refused one by one.
        let allow_tmp = parse("Allow", "b/tmp/*");
        let other = facts(false, CannedAcl::Private, None, Ownership::ObjectWriter, Some(&allow_tmp));
        assert_eq!(decide(&user("t", "u"), &del, &any, &other), Decision::Allow);
        // No grant at all: refused up front.
        let other = facts(false, CannedAcl::Private, None, Ownership::ObjectWriter, None);
        assert_eq!(decide(&user("t", "u"), &del, &any, &other), Decision::Deny { explicit: false });
    }

    #[test]
    fn policies_are_validated() {
        let bad = [
            "not json",
            "[]",
            r#"{"Statement":[]}"#,
            r#"{"Version":"2020-01-01","Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            r#"{"Statement":{"Effect":"Maybe","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"iam:PassRole","Resource":"arn:aws:s3:::b/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"b/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{}}}"#,
            r#"{"Statement":{"Effect":"Allow","NotPrincipal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":{"Service":"x"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
            r#"{"Statement":{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam:::root"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#,
        ];
        for b in bad {
            assert!(Policy::parse(b, Some("b")).is_err(), "{b}");
        }
        assert!(Policy::parse(&"x".repeat(MAX_POLICY_BYTES + 1), Some("b")).is_err());
        let ok = Policy::parse(
            r#"{"Version":"2012-10-17","Id":"x","Statement":[{"Sid":"a","Effect":"Allow","Principal":{"AWS":["t1","arn:aws:iam::t2:root","arn:aws:iam::t3:user/u"]},"Action":["s3:GetObject","s3:List*"],"Resource":["arn:aws:s3:::b","arn:aws:s3:::b/p*"]}]}"#,
            Some("b"),
        )
        .unwrap();
        assert_eq!(
            ok.statements[0].principals,
            vec![
                PrincipalPattern::Tenant("t1".into()),
                PrincipalPattern::Tenant("t2".into()),
                PrincipalPattern::User { tenant: "t3".into(), user: "u".into() }
            ]
        );
    }

    #[test]
    fn canned_acls_round_trip_through_grants() {
        for a in [CannedAcl::Private, CannedAcl::PublicRead, CannedAcl::PublicReadWrite, CannedAcl::AuthenticatedRead] {
            assert_eq!(CannedAcl::from_grants(&a.grants()), Some(a));
            assert_eq!(CannedAcl::parse(a.as_str()), Some(a));
        }
        assert_eq!(CannedAcl::from_grants(&[(Group::AllUsers, Permission::Write)]), None);
        assert_eq!(CannedAcl::from_grants(&[(Group::AllUsers, Permission::ReadAcp)]), None);
        assert_eq!(CannedAcl::parse("log-delivery-write"), None);
    }

    /// A reference glob by backtracking.
    fn naive(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) => (0..=t.len()).any(|i| naive(rest, &t[i..])),
            Some((c, rest)) => !t.is_empty() && (*c == b'?' || *c == t[0]) && naive(rest, &t[1..]),
        }
    }

    proptest! {
        #[test]
        fn glob_matches_the_naive_reference(p in "[ab*?/]{0,8}", t in "[ab/]{0,8}") {
            prop_assert_eq!(glob(&p, &t), naive(p.as_bytes(), t.as_bytes()));
            // glob_prefix: some extension of t matches.
            let some_extension = (0..=3).any(|n| {
                let exts: Vec<String> = (0..(1 << (2 * n))).map(|i| (0..n).map(|d| ["a", "b", "/", "a"][(i >> (2 * d)) & 3]).collect()).collect();
                exts.iter().any(|e| naive(p.as_bytes(), format!("{t}{e}").as_bytes()))
            });
            if some_extension {
                prop_assert!(glob_prefix(&p, &t));
            }
        }

        #[test]
        fn an_explicit_deny_always_wins_except_owner_policy_management(
            op in proptest::sample::select(OPS.to_vec()),
            owner in any::<bool>(),
            anon in any::<bool>(),
            acl in proptest::sample::select(CannedAcl::ALL.to_vec()),
        ) {
            let p = if anon && !owner { Principal::Anonymous } else { user("t", "u") };
            let pol = Policy::parse(r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"*","Resource":"arn:aws:s3:::*"},{"Effect":"Deny","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::b*"}]}"#, None).unwrap();
            let f = facts(owner, acl, Some(acl), Ownership::ObjectWriter, Some(&pol));
            let d = decide(&p, &Action::of_operation(op), &resource_of(op), &f);
            let manages = matches!(op, "GetBucketPolicy" | "PutBucketPolicy" | "DeleteBucketPolicy");
            prop_assert_eq!(d, if owner && manages { Decision::Allow } else { Decision::Deny { explicit: true } });
        }
    }
}
