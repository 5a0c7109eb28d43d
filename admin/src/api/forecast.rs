//! The quota forecast.
//!
//! - `GET /api/admin/forecast` -> [`crate::forecast::ForecastView`]: per account, each
//!   window's use, reset, burn (percent per hour, and whether it was observed on the account
//!   or is its plan's mean) and when it runs out; when the account runs out and when its
//!   capacity returns; per plan, the mean burn; for the pool, its demand, when no account
//!   can serve any more and when the first comes back. Reset credits (as last polled) count:
//!   each is spent when its account runs out (`credits_used`), and the pool's run-out
//!   without them is shown too (`exhausts_without_credits_at_ms`). Each call samples the
//!   pool first.

use axum::{extract::State, routing::get, Json, Router};

use super::{ApiResult, AppState};
use crate::forecast::ForecastView;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/forecast", get(get_forecast))
}

async fn get_forecast(State(core): State<AppState>) -> ApiResult<ForecastView> {
    let credits = core
        .reset_credits
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(Json(
        core.forecast.view(&core.publisher.current(), &credits),
    ))
}
