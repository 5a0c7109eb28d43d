//! The quota forecast.
//!
//! - `GET /api/admin/forecast` -> [`crate::forecast::ForecastView`]: per account, each
//!   window's use, reset, burn (percent per hour, and whether it was observed on the account
//!   or is its plan's mean) and when it runs out; when the account runs out and when its
//!   capacity returns; per plan, the mean burn; for the pool, its demand, when no account
//!   can serve any more and when the first comes back. Each call samples the pool first.

use axum::{extract::State, routing::get, Json, Router};

use super::{ApiResult, AppState};
use crate::forecast::ForecastView;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/forecast", get(get_forecast))
}

async fn get_forecast(State(core): State<AppState>) -> ApiResult<ForecastView> {
    Ok(Json(core.forecast.view(&core.publisher.current())))
}
