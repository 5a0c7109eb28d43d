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

use std::sync::Arc;

use axum::{extract::State, routing::get, Json, Router};

use super::ApiResult;
use crate::{forecast::ForecastView, services::Forecast};

pub(super) fn routes(forecast: Arc<Forecast>) -> Router {
    Router::new()
        .route("/forecast", get(get_forecast))
        .with_state(forecast)
}

async fn get_forecast(State(forecast): State<Arc<Forecast>>) -> ApiResult<ForecastView> {
    let credits = forecast.credits.all();
    Ok(Json(
        forecast
            .forecaster
            .view(&forecast.publisher.current(), &credits),
    ))
}
