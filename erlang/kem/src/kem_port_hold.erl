%%% @doc Calls held while callers queue (docs/protocol.md, "Batch frames",
%%% "Group frames"): the owner's (kem_port) `out' and `out_bytes', and when
%%% they go to the port. kem_group, kept pure, says what frames they go out
%%% as; this module decides when, and sends them.
%%%
%%% While more messages wait in the owner's mailbox a call is held, and the
%%% held calls go out when the mailbox is empty, ?HOLD_CALLS are held or
%%% ?HOLD_BYTES: calls of one kernel, hint and input size as group frames,
%%% the rest as one calls frame; a lone caller's call finds the mailbox
%%% empty and goes out at once, as its own frame. A call whose frame is over
%%% ?LONE_BYTES goes alone, after what is held (and, like a held call, is
%%% sent again to the replacement if the port is closed). Each caller has
%%% one call here at most (kem_port:call/4 waits for its reply), so the
%%% order in which held frames go out cannot reorder one caller's calls.
-module(kem_port_hold).

-export([queue/2, flush/1, settle/1]).

%% 64, not the 256 a group frame may hold: at 256 callers (lavapipe
%% machine, 2 shared cores, alternating runs) a hold of 256 gained nothing:
%% on the echo port group frames of 59-60 calls on average either way (the
%% mailbox empties first), 119-165k calls/s against 115-136k; on kem
%% 15.3k/16.3k against 16.3k/22.3k with 64 (docs/benchmarks.md, "Group
%% frames, from Erlang"). 64 keeps calls frames as they were (the port's
%% batch, KEM_MAX_BATCH).
-define(HOLD_CALLS, 64).
-define(HOLD_BYTES, 1048576).
-include("kem_frames.hrl").  % ?LONE_BYTES

%% The owner's state; this module reads `port' and `name' and owns `out'
%% (newest first) and `out_bytes'.
-type owner() :: #{port := port() | undefined, name := atom(), out := [kem_group:held()],
                   out_bytes := non_neg_integer(), atom() => term()}.
%% `closed': the port closed under us; the calls not sent are in `out'.
-type sent() :: {ok, owner()} | {closed, owner()}.

%% @doc Hold one call, or send what is held when the hold is full; a call
%% over ?LONE_BYTES goes alone at once, after what is held.
-spec queue(kem_group:held(), owner()) -> sent().
queue(Call = {_Id, Frame}, State) when is_binary(Frame), byte_size(Frame) > ?LONE_BYTES ->
    case flush(State) of
        {ok, Flushed} -> send_units([{lone, [Call], Frame}], Flushed);
        Closed -> Closed
    end;
queue(Call = {_Id, Item}, State = #{out := Held, out_bytes := Bytes}) ->
    NewBytes = Bytes + kem_group:held_bytes(Item),
    Queued = State#{out := [Call | Held], out_bytes := NewBytes},
    case length(Held) + 1 >= ?HOLD_CALLS orelse NewBytes >= ?HOLD_BYTES of
        true -> flush(Queued);
        false -> {ok, Queued}
    end.

%% @doc Send every held call now (kem_group's frames, oldest call first).
-spec flush(owner()) -> sent().
flush(State = #{out := []}) ->
    {ok, State};
flush(State = #{out := Held}) ->
    send_units(kem_group:frames(lists:reverse(Held)), State#{out := [], out_bytes := 0}).

%% @doc The end of an owner's callback: with calls held, send them now if
%% nothing else waits in the mailbox, or come back (gen_server timeout 0)
%% once it is empty. `{closed, State}': the owner stops (its terminate has
%% the held calls sent to the next port).
-spec settle(sent()) -> {noreply, owner()} | {noreply, owner(), 0} | {closed, owner()}.
settle({ok, State = #{out := []}}) ->
    {noreply, State};
settle({ok, State}) ->
    case erlang:process_info(self(), message_queue_len) of
        {message_queue_len, 0} -> settle(flush(State));
        _ -> {noreply, State, 0}
    end;
settle({closed, State}) ->
    {closed, State}.

%%% internals

%% Each frame in turn; if the port is closed, the calls of the frames not
%% sent are held again (the owner's terminate/2 has them sent to the
%% replacement).
send_units([], State) ->
    {ok, State};
send_units(Units = [{Kind, Calls, Frame} | Rest], State = #{port := Port}) ->
    try port_command(Port, Frame) of
        true ->
            Kind =:= group andalso kem_metrics:group_sent(maps:get(name, State), length(Calls)),
            send_units(Rest, State)
    catch
        error:badarg -> {closed, State#{out := lists:append([C || {_, C, _} <- Units])}}
    end.
