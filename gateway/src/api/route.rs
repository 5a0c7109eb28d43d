//! The route table: what a request head names, and what each route is. One function maps a
//! path (and, with the method, a request) to a [`Route`]; everything the API layer decides per
//! route (the metrics and usage label, the error dialect, the methods, whether the head is
//! authenticated, admitted under the key's limits and its body read) is its row of one table,
//! [`Route::spec`], so a new surface is one more variant, its paths and one row (and its
//! handler's arm in `super::handle`).
//!
//! # Key Components
//! - [`Route::of_path`]: the route a path names, whatever the method (the front door answers
//!   before dispatch with it, `super::refuse_front_door`): `/v1` and `/v1`-less aliases,
//!   trailing slashes, the Codex CLI's ChatGPT-mode paths (`/backend-api/...`, `/api/...`;
//!   docs/protocol.md#endpoints).
//! - [`Route::dispatch`]: the route and what to do with the method ([`Action`]): serve it,
//!   405, or 426 for a `GET /v1/responses` without `Upgrade: websocket`.
//! - [`Route::spec`]: the table, one row per route ([`Spec`]): its label (the `route` label
//!   of `codex_gateway_requests_total` and of usage and access records, the one place a
//!   [`Route`] becomes a string, [`Route::label`]), its dialect, the methods it takes and what
//!   the one front step does for it ([`Front`]).

use crate::error::Dialect;

/// Every route the gateway answers. ChatGPT-mode inference (`/backend-api/codex/responses`,
/// `.../compact`) is the very same route as `/v1/responses` (`/v1/responses/compact`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET`/`HEAD /healthz`.
    Healthz,
    /// `GET /metrics` (its own bearer token, `metrics_token`, not a client key).
    Metrics,
    /// `HEAD /`: Anthropic clients' connectivity probe.
    Probe,
    /// `POST /v1/responses` (the WebSocket upgrade of `GET` is taken before dispatch).
    Responses,
    /// `POST /v1/responses/compact`: remote compaction v1.
    Compact,
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic).
    CountTokens,
    /// `GET /v1/models`.
    Models,
    /// `GET /v1/models/{id}`.
    Model,
    /// `GET /v1/usage`: the calling key's usage and limits.
    Usage,
    /// `GET /backend-api/codex/models`: the Codex catalog (ChatGPT mode).
    CodexModels,
    /// `GET /backend-api/wham/usage` (`/api/codex/usage`): the pool's limits (ChatGPT mode).
    PoolUsage,
    /// `GET /backend-api/wham/accounts/check` (`/api/codex/accounts/check`): workspace
    /// routing (ChatGPT mode).
    AccountsCheck,
    /// Any other path under the ChatGPT-mode prefixes: a cheap 404 the CLI tolerates.
    SideCall,
    /// No route: 404.
    NotFound,
}

/// What [`Route::dispatch`] makes of a request's method on its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Serve it.
    Serve,
    /// A known route, a method it does not take: 405.
    MethodNotAllowed,
    /// `GET /v1/responses` without `Upgrade: websocket`: 426, say how to reach the resource.
    UpgradeRequired,
}

/// A path without its trailing slashes (`/` for the root).
pub fn trimmed(path: &str) -> &str {
    let p = path.trim_end_matches('/');
    if p.is_empty() {
        "/"
    } else {
        p
    }
}

// === impl Route ===

impl Route {
    /// Every route, for tables and tests.
    pub const ALL: [Route; 16] = [
        Self::Healthz,
        Self::Metrics,
        Self::Probe,
        Self::Responses,
        Self::Compact,
        Self::Chat,
        Self::Messages,
        Self::CountTokens,
        Self::Models,
        Self::Model,
        Self::Usage,
        Self::CodexModels,
        Self::PoolUsage,
        Self::AccountsCheck,
        Self::SideCall,
        Self::NotFound,
    ];

    /// The route `path` names, whatever the method.
    pub fn of_path(path: &str) -> Self {
        match trimmed(path) {
            "/healthz" => Self::Healthz,
            "/metrics" => Self::Metrics,
            "/" => Self::Probe,
            "/v1/responses" | "/responses" => Self::Responses,
            "/v1/responses/compact" | "/responses/compact" => Self::Compact,
            "/v1/chat/completions" | "/chat/completions" => Self::Chat,
            "/v1/messages" | "/messages" => Self::Messages,
            "/v1/messages/count_tokens" | "/messages/count_tokens" => Self::CountTokens,
            "/v1/models" | "/models" => Self::Models,
            p if p.starts_with("/v1/models/") => Self::Model,
            "/v1/usage" | "/usage" => Self::Usage,
            p => Self::chatgpt(p),
        }
    }

    /// The ChatGPT-mode route of a trimmed path; `/api/codex/...` is the form the CLI uses
    /// when its base is not a `backend-api` base (docs/protocol.md#endpoints).
    fn chatgpt(path: &str) -> Self {
        let Some(rest) = path
            .strip_prefix("/backend-api/")
            .or_else(|| path.strip_prefix("/api/"))
        else {
            return Self::NotFound;
        };
        match rest {
            "codex/responses" => Self::Responses,
            "codex/responses/compact" => Self::Compact,
            "codex/models" => Self::CodexModels,
            "wham/usage" | "codex/usage" => Self::PoolUsage,
            "wham/accounts/check" | "codex/accounts/check" => Self::AccountsCheck,
            _ => Self::SideCall,
        }
    }

    /// The route of a request and what to do with its method ([`Spec::methods`]). `HEAD /`
    /// is the probe; any other method on `/` names nothing (404).
    pub fn dispatch(method: &str, path: &str) -> (Self, Action) {
        let route = Self::of_path(path);
        let action = match (route.spec().methods, method) {
            (Methods::Any, _) | (Methods::Get, "GET") | (Methods::Post, "POST") => Action::Serve,
            (Methods::GetHead, "GET" | "HEAD") | (Methods::Head, "HEAD") => Action::Serve,
            (Methods::Head, _) => return (Self::NotFound, Action::Serve),
            (Methods::PostOrUpgrade, "POST") => Action::Serve,
            (Methods::PostOrUpgrade, "GET") => Action::UpgradeRequired,
            _ => Action::MethodNotAllowed,
        };
        (route, action)
    }

    /// The route's row of the table: everything the API layer decides per route but its
    /// paths ([`Route::of_path`]) and its handler (`super::handle`).
    pub const fn spec(self) -> Spec {
        use Dialect::{Anthropic, OpenAi};
        use Front::{Admitted, Key, KeyBody, Open};
        match self {
            Self::Healthz => row("healthz", OpenAi, Methods::GetHead, Open),
            Self::Metrics => row("metrics", OpenAi, Methods::Get, Open),
            Self::Probe => row("other", OpenAi, Methods::Head, Open),
            Self::Responses => row("responses", OpenAi, Methods::PostOrUpgrade, Admitted),
            Self::Compact => row("responses_compact", OpenAi, Methods::Post, Admitted),
            Self::Chat => row("chat_completions", OpenAi, Methods::Post, Admitted),
            Self::Messages => row("messages", Anthropic, Methods::Post, Admitted),
            Self::CountTokens => row("messages_count_tokens", Anthropic, Methods::Post, KeyBody),
            Self::Models | Self::Model | Self::CodexModels => {
                row("models", OpenAi, Methods::Get, Key)
            }
            Self::Usage => row("usage", OpenAi, Methods::Get, Key),
            Self::PoolUsage | Self::AccountsCheck => row("chatgpt", OpenAi, Methods::Get, Key),
            Self::SideCall => row("chatgpt", OpenAi, Methods::Any, Open),
            Self::NotFound => row("other", OpenAi, Methods::Any, Open),
        }
    }

    /// Whether the front door (`crate::front_door`) never limits it: probes and scrapers must
    /// see a refusing instance (`/metrics` has its own token, `metrics_token`).
    pub const fn front_door_exempt(self) -> bool {
        matches!(self, Self::Healthz | Self::Metrics)
    }

    /// The `route` label of metrics, usage and access records (the values dashboards know).
    pub const fn label(self) -> &'static str {
        self.spec().label
    }

    /// The dialect its answers (errors included) are written in: Anthropic's on the Messages
    /// routes, OpenAI's everywhere else.
    pub const fn dialect(self) -> Dialect {
        self.spec().dialect
    }

    /// Whether the head must carry a client key (`super::authenticate`). `/metrics` has its
    /// own token; health, the probe, ChatGPT-mode side calls and 404s take none.
    pub const fn authenticates(self) -> bool {
        !matches!(self.spec().front, Front::Open)
    }

    /// Whether it is admitted under the key's limits (`crate::limits::admit`): every route
    /// that goes upstream.
    pub const fn admitted(self) -> bool {
        matches!(self.spec().front, Front::Admitted)
    }

    /// Whether its body is read and decoded before its handler runs.
    pub const fn reads_body(self) -> bool {
        matches!(self.spec().front, Front::Admitted | Front::KeyBody)
    }
}

/// One route's row of the table ([`Route::spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The `route` label of metrics, usage and access records (one of `metrics::ROUTES`).
    pub label: &'static str,
    /// The dialect of its answers.
    pub dialect: Dialect,
    /// The methods it takes.
    pub methods: Methods,
    /// What the one front step does before its handler.
    pub front: Front,
}

/// A row of the table.
const fn row(label: &'static str, dialect: Dialect, methods: Methods, front: Front) -> Spec {
    Spec {
        label,
        dialect,
        methods,
        front,
    }
}

/// The methods a route takes; any other is a 405.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Methods {
    /// `GET`.
    Get,
    /// `GET` and `HEAD`.
    GetHead,
    /// `HEAD` only; any other method names nothing (404).
    Head,
    /// `POST`.
    Post,
    /// `POST`; a `GET` (without `Upgrade: websocket`, taken before dispatch) is a 426.
    PostOrUpgrade,
    /// Any method.
    Any,
}

/// What the one front step (`super::read_authenticated`) does for a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// Nothing: no client key (`/metrics` checks its own token).
    Open,
    /// Authenticates the key.
    Key,
    /// Authenticates the key, reads and decodes the body.
    KeyBody,
    /// Authenticates the key, admits the request under the key's limits, reads and decodes
    /// the body: every route that goes upstream.
    Admitted,
}

#[cfg(test)]
mod tests {
    use super::{Action, Route};
    use crate::error::Dialect;

    #[test]
    fn health_and_metrics_are_exempt_from_the_front_door() {
        let exempt = |p| Route::of_path(p).front_door_exempt();
        assert!(exempt("/healthz") && exempt("/metrics/") && !exempt("/v1/responses"));
    }

    /// Every path the gateway names, with each method, gives its route and action.
    #[test]
    fn every_path_and_method_maps_to_its_route() {
        use Action::{MethodNotAllowed as Nope, Serve, UpgradeRequired as Upgrade};
        let cases: &[(&str, &str, Route, Action)] = &[
            ("GET", "/healthz", Route::Healthz, Serve),
            ("HEAD", "/healthz/", Route::Healthz, Serve),
            ("POST", "/healthz", Route::Healthz, Nope),
            ("GET", "/metrics", Route::Metrics, Serve),
            ("HEAD", "/metrics", Route::Metrics, Nope),
            ("HEAD", "/", Route::Probe, Serve),
            ("GET", "/", Route::NotFound, Serve),
            ("POST", "/", Route::NotFound, Serve),
            ("POST", "/v1/responses", Route::Responses, Serve),
            ("POST", "/responses", Route::Responses, Serve),
            ("POST", "/v1/responses/", Route::Responses, Serve),
            (
                "POST",
                "/backend-api/codex/responses",
                Route::Responses,
                Serve,
            ),
            ("POST", "/api/codex/responses", Route::Responses, Serve),
            ("GET", "/v1/responses", Route::Responses, Upgrade),
            ("GET", "/responses", Route::Responses, Upgrade),
            (
                "GET",
                "/backend-api/codex/responses",
                Route::Responses,
                Upgrade,
            ),
            ("PUT", "/v1/responses", Route::Responses, Nope),
            (
                "DELETE",
                "/backend-api/codex/responses",
                Route::Responses,
                Nope,
            ),
            ("POST", "/v1/responses/compact", Route::Compact, Serve),
            ("POST", "/responses/compact/", Route::Compact, Serve),
            (
                "POST",
                "/backend-api/codex/responses/compact",
                Route::Compact,
                Serve,
            ),
            (
                "POST",
                "/api/codex/responses/compact",
                Route::Compact,
                Serve,
            ),
            ("GET", "/v1/responses/compact", Route::Compact, Nope),
            ("GET", "/api/codex/responses/compact", Route::Compact, Nope),
            ("POST", "/v1/chat/completions", Route::Chat, Serve),
            ("POST", "/chat/completions", Route::Chat, Serve),
            ("GET", "/v1/chat/completions", Route::Chat, Nope),
            ("POST", "/v1/messages", Route::Messages, Serve),
            ("POST", "/messages/", Route::Messages, Serve),
            ("GET", "/v1/messages", Route::Messages, Nope),
            (
                "POST",
                "/v1/messages/count_tokens",
                Route::CountTokens,
                Serve,
            ),
            ("POST", "/messages/count_tokens", Route::CountTokens, Serve),
            ("GET", "/messages/count_tokens", Route::CountTokens, Nope),
            ("GET", "/v1/models", Route::Models, Serve),
            ("GET", "/models/", Route::Models, Serve),
            ("POST", "/v1/models", Route::Models, Nope),
            ("GET", "/v1/models/gpt-5", Route::Model, Serve),
            ("DELETE", "/v1/models/gpt-5", Route::Model, Nope),
            ("GET", "/v1/usage", Route::Usage, Serve),
            ("GET", "/usage", Route::Usage, Serve),
            ("POST", "/v1/usage", Route::Usage, Nope),
            (
                "GET",
                "/backend-api/codex/models",
                Route::CodexModels,
                Serve,
            ),
            (
                "POST",
                "/backend-api/codex/models",
                Route::CodexModels,
                Nope,
            ),
            ("GET", "/backend-api/wham/usage", Route::PoolUsage, Serve),
            ("GET", "/api/codex/usage", Route::PoolUsage, Serve),
            (
                "GET",
                "/backend-api/wham/accounts/check",
                Route::AccountsCheck,
                Serve,
            ),
            (
                "GET",
                "/api/codex/accounts/check",
                Route::AccountsCheck,
                Serve,
            ),
            (
                "POST",
                "/api/codex/accounts/check",
                Route::AccountsCheck,
                Nope,
            ),
            (
                "GET",
                "/backend-api/ps/plugins/list",
                Route::SideCall,
                Serve,
            ),
            (
                "POST",
                "/backend-api/codex/analytics-events",
                Route::SideCall,
                Serve,
            ),
            ("GET", "/backend-api", Route::NotFound, Serve),
            ("GET", "/v2/responses", Route::NotFound, Serve),
            ("POST", "/v1/embeddings", Route::NotFound, Serve),
        ];
        for &(method, path, route, action) in cases {
            assert_eq!(
                Route::dispatch(method, path),
                (route, action),
                "{method} {path}"
            );
        }
        // Every route is reached by some request.
        for r in Route::ALL {
            assert!(
                cases.iter().any(|c| c.2 == r),
                "{r:?} has no path in the table"
            );
        }
    }

    /// The front door's view (the path alone) is the dispatch's route, for every method.
    #[test]
    fn the_path_alone_names_the_route_the_dispatch_serves() {
        for path in [
            "/v1/messages",
            "/messages/count_tokens/",
            "/v1/chat/completions",
            "/backend-api/codex/responses",
            "/backend-api/codex/models",
            "/v1/usage",
            "/nope",
        ] {
            for method in ["GET", "POST", "PUT"] {
                assert_eq!(Route::dispatch(method, path).0, Route::of_path(path));
            }
        }
    }

    #[test]
    fn each_route_has_its_label_dialect_and_front_step() {
        // (route, label, dialect, authenticates, admitted, reads body)
        use Dialect::{Anthropic, OpenAi};
        let table = [
            (Route::Healthz, "healthz", OpenAi, false, false, false),
            (Route::Metrics, "metrics", OpenAi, false, false, false),
            (Route::Probe, "other", OpenAi, false, false, false),
            (Route::Responses, "responses", OpenAi, true, true, true),
            (
                Route::Compact,
                "responses_compact",
                OpenAi,
                true,
                true,
                true,
            ),
            (Route::Chat, "chat_completions", OpenAi, true, true, true),
            (Route::Messages, "messages", Anthropic, true, true, true),
            (
                Route::CountTokens,
                "messages_count_tokens",
                Anthropic,
                true,
                false,
                true,
            ),
            (Route::Models, "models", OpenAi, true, false, false),
            (Route::Model, "models", OpenAi, true, false, false),
            (Route::Usage, "usage", OpenAi, true, false, false),
            (Route::CodexModels, "models", OpenAi, true, false, false),
            (Route::PoolUsage, "chatgpt", OpenAi, true, false, false),
            (Route::AccountsCheck, "chatgpt", OpenAi, true, false, false),
            (Route::SideCall, "chatgpt", OpenAi, false, false, false),
            (Route::NotFound, "other", OpenAi, false, false, false),
        ];
        assert_eq!(table.len(), Route::ALL.len());
        for (r, label, dialect, auth, admit, body) in table {
            assert_eq!(r.label(), label, "{r:?}");
            assert_eq!(r.dialect(), dialect, "{r:?}");
            assert_eq!(r.authenticates(), auth, "{r:?}");
            assert_eq!(r.admitted(), admit, "{r:?}");
            assert_eq!(r.reads_body(), body, "{r:?}");
            // Every label is one `/metrics` counts under its own name.
            assert_eq!(
                crate::metrics::ROUTES[crate::metrics::route_index(label)],
                label,
                "{r:?}"
            );
        }
    }
}
